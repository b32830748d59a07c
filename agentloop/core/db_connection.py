"""This thread's database connection, closed when it can no longer be trusted, so that the
next query opens a new one (a broken connection is closed and reopened, never reused).

A fault distrusts more than the connection it broke. When one thread of a process finds
PostgreSQL away, every connection the process opened before that moment may lead to a
host that is gone — a primary lost in a failover, its link cut — and checking such a
connection with a query waits out the TCP user timeout (DATABASE_TCP_USER_TIMEOUT)
before it fails: measured in the failover test, an admitter idle through the outage
probed its connection to the lost primary and held 25 webhook POSTs 4 s after the new
primary was accepting. So each connection is stamped with the process's fault count when
it opens, and one older than the last fault is closed unasked, not probed: at worst a
healthy connection is opened again once.

Here, below the apps, and not in the worker's package: the web process needs it too (the
lean intake path, /metrics), and importing it from `conversations.worker` loaded the
whole worker — supervisor, turn runner, agents — into every web server (0.15 s of CPU
at each start, measured with `python -X importtime`)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.backends.signals import connection_created

# Database faults this process has met (PostgreSQL only: SQLite's "database is locked"
# says nothing of the file, and its connections stay). Only ever grows; a lost increment
# between two threads that both saw a fault still leaves it past both their connections.
_faults = 0
STAMP = "agentloop_faults_at_open"


def _stamp(sender: Any, connection: Any, **kwargs: Any) -> None:
    setattr(connection, STAMP, _faults)


connection_created.connect(_stamp, dispatch_uid="agentloop.core.db_connection.stamp")


def note_fault() -> None:
    """A connection of this thread was found broken: see the module's docstring."""
    global _faults
    if connection.vendor != "sqlite":
        _faults += 1
        _drain_pool()


def _drain_pool() -> None:
    """With DATABASE_POOL, the pool's connections are the process's too, and a stamp is
    set at each checkout, not when the connection opened: the pool closes those it holds
    and replaces them, and closes those lent out as they come back (psycopg_pool's
    drain), so no request is handed a connection to the lost host to probe."""
    pool = getattr(connection, "pool", None)  # None unless DATABASE_POOL (Django's psycopg pool)
    if pool is not None:
        try:
            pool.drain()
        except Exception:  # a pool closing as the process ends: nothing left to distrust
            pass


def opened_before_a_fault() -> bool:
    """Whether this thread's open connection is older than the last fault the process met."""
    return connection.connection is not None and getattr(connection, STAMP, 0) < _faults


def close_broken_connection() -> None:
    """Close this thread's connection if it can no longer be trusted: opened before a
    fault (not probed: see the module's docstring), or found unusable."""
    if opened_before_a_fault():
        force_close()
        return
    try:
        if connection.connection is not None and not connection.is_usable():
            note_fault()
            connection.close()
    except Exception:  # a dead socket may refuse even the check
        note_fault()
        force_close()


def close_after_fault() -> None:
    """This thread's step met a database fault: close its connection, and if the fault
    broke it (not a deadlock or a cancelled statement on a sound one), distrust every other
    connection of the process opened before now."""
    try:
        sound = connection.connection is not None and connection.is_usable()
    except Exception:
        sound = False
    if not sound:
        note_fault()
    force_close()


def force_close() -> None:
    """Close this thread's connection whatever state it is in."""
    try:
        connection.close()
    except Exception:
        connection.connection = None
