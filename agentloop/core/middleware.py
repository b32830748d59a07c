"""The web side of a database outage: 503 with Retry-After, never a 500 with a trace.

While PostgreSQL restarts, a backend is killed or the server is unreachable — or a
SQLite writer cannot get the write lock within SQLITE_TIMEOUT — every view that needs
the database fails with OperationalError / InterfaceError. Telegram and API clients
retry a 503 (and honour Retry-After), so the message is delivered again once the
database is back; an admission is one transaction, so nothing was half-stored. The
broken connection is closed here, so the next request connects afresh.

The 503 is logged once per kind of fault per interval, not once per request: during an
outage every request fails the same way, and a log line per request buries the one
that says what happened.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from django.db import InterfaceError, OperationalError, connections
from django.http import JsonResponse
from django.utils.deprecation import MiddlewareMixin

from agentloop.core import metrics
from agentloop.core.db_connection import note_fault

if TYPE_CHECKING:
    from django.http import HttpRequest

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
LOG_INTERVAL = 10.0

# SQLite raises OperationalError for programming errors too ("no such table"); only
# these mean "the database is busy or unreachable, try again".
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "unable to open database",
                     "disk i/o error")


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database is away or busy (retryable), not that a query is wrong."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    if isinstance(exc.__cause__, sqlite3.OperationalError):
        return any(text in str(exc).lower() for text in _SQLITE_TRANSIENT)
    return True  # PostgreSQL: connection failures, admin shutdown, cancelled statements


class _OncePerInterval:
    """Logs the first fault of a kind, then at most once per interval with a count."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lock = threading.Lock()
        self.last: dict[str, tuple[float, int]] = {}  # kind -> (last logged, suppressed since)

    def __call__(self, kind: str, message: str) -> None:
        now = time.monotonic()
        with self.lock:
            logged_at, suppressed = self.last.get(kind, (float("-inf"), 0))
            if now - logged_at < self.interval:
                self.last[kind] = (logged_at, suppressed + 1)
                return
            self.last[kind] = (now, 0)
        more = f" ({suppressed} more like it in the last {self.interval:.0f} s)" if suppressed else ""
        log.warning("database unavailable, answering 503: %s%s", message, more)


_log_fault = _OncePerInterval(LOG_INTERVAL)


def _close_broken_connections() -> None:
    """A connection that failed is closed, so the next request opens a new one (a
    SQLite connection that met the lock is fine and stays)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
            note_fault()
            conn.close()


def _describe(exc: BaseException) -> str:
    """Type and first line only: enough to tell the faults apart, no query, no parameters."""
    first_line = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc.__cause__ or exc).__name__}: {first_line}"


def unavailable_response() -> JsonResponse:
    metrics.DATABASE_UNAVAILABLE_ANSWERS.inc()
    response = JsonResponse({"ok": False, "error": "database unavailable, retry later"}, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    # Logged here, rate-limited; django.request would log every single 503 as an error.
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's private flag (log_response)
    return response


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Turns a view's database outage into 503 + Retry-After (see the module docstring).
    Sync and async capable (no extra thread hop under daphne); its one hook,
    process_exception, runs in the view's thread, where the failed connection lives."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> JsonResponse | None:
        if not database_unavailable(exception):
            return None
        _log_fault(type(exception.__cause__ or exception).__name__, _describe(exception))
        _close_broken_connections()
        return unavailable_response()
