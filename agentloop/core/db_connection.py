"""This thread's database connection, closed when it can no longer be trusted, so that the
next query opens a new one (a broken connection is closed and reopened, never reused).

Here, below the apps, and not in the worker's package: the web process needs it too (the
lean intake path, /metrics), and importing it from `conversations.worker` loaded the
whole worker — supervisor, turn runner, agents — into every web server (0.15 s of CPU
at each start, measured with `python -X importtime`)."""

from __future__ import annotations

from django.db import connection


def close_broken_connection() -> None:
    """Close this thread's connection if it can no longer be trusted."""
    try:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
    except Exception:  # a dead socket may refuse even the check
        force_close()


def force_close() -> None:
    """Close this thread's connection whatever state it is in."""
    try:
        connection.close()
    except Exception:
        connection.connection = None
