"""Django's SQLite backend, tuned for several processes writing at once.

1. Writers queue instead of polling. With `transaction_mode=IMMEDIATE` every atomic
   block takes SQLite's write lock at BEGIN, and SQLite makes a writer that finds it
   taken poll with growing sleeps (1, 2, 5 … 100 ms). A busy web process committing
   back to back then starves the worker loop for seconds (measured: flushes 2 s
   late). Here a write transaction first takes a mutex (threads of this process)
   and then an OS file lock beside the database (other processes): waiters sleep in
   the kernel and wake the moment the holder commits. Both are waited for at most
   the configured timeout (SQLITE_TIMEOUT): a writer behind a stuck holder gets
   "database is locked", which the web side answers with 503 + Retry-After.
2. Statements outside transactions that meet the lock are retried every fraction of
   a millisecond until the configured timeout (the busy timeout itself is 0).
3. Connections are pooled per process. Under ASGI every request runs in a fresh
   thread, so Django opened (and closed) a connection per request: the open, the
   PRAGMAs, re-preparing every statement, and — when the last connection to a WAL
   database closes — a full checkpoint. A closed connection that is idle now goes
   back to a small pool for the next thread (Django already opens SQLite
   connections with check_same_thread=False and checks thread use itself).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import OperationalError
from django.db.backends.sqlite3 import base

from agentloop.core.sqlite import checkpoints

_write_locks: dict[str, threading.Lock] = {}
_pools: dict[str, list[sqlite3.Connection]] = {}
POOL_SIZE = 8
_process_locks: dict[str, _ProcessLock] = {}
_registry_lock = threading.Lock()
RETRY_STEPS = (0.0002, 0.0005, 0.001, 0.002)
T = TypeVar("T")
DatabaseName = str | os.PathLike[str]  # settings_dict["NAME"]


def _lock_for(name: DatabaseName) -> threading.Lock:
    with _registry_lock:
        return _write_locks.setdefault(str(name), threading.Lock())


class _ProcessLock:
    """The OS file lock beside the database, taken within a deadline. One descriptor per
    process: flock excludes other processes, not our threads (their thread lock does).

    flock() cannot time out, so a contended lock is waited for by a helper thread while
    the caller waits for the helper until its deadline; a lock the helper gets after its
    caller gave up is handed back at once (or to the next caller already waiting).
    Callers are serialised by the database's thread lock: at most one waits here."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.changed = threading.Condition()
        self.pending = False  # the helper is blocked in flock()
        self.waiting = False  # a caller waits for the helper
        self.handed = False  # the helper got the lock for the waiting caller

    def acquire(self, timeout: float) -> bool:
        with self.changed:
            if not self.pending:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    self.pending = True
                    threading.Thread(target=self._wait_for_lock, name="sqlite-write-lock", daemon=True).start()
            self.waiting = True
            try:
                return self.changed.wait_for(lambda: self.handed, max(0.0, timeout))
            finally:
                self.waiting = self.handed = False

    def _wait_for_lock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # released by the kernel if we die
        with self.changed:
            self.pending = False
            if self.waiting:
                self.handed = True
                self.changed.notify_all()
            else:
                fcntl.flock(self.fd, fcntl.LOCK_UN)  # its caller gave up

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _process_lock_for(name: DatabaseName) -> _ProcessLock:
    with _registry_lock:
        if str(name) not in _process_locks:
            _process_locks[str(name)] = _ProcessLock(f"{name}-writelock")
        return _process_locks[str(name)]


def _locked_error(timeout: float) -> OperationalError:
    """The error a BUSY statement would have raised, as Django wraps it."""
    cause = sqlite3.OperationalError(
        f"database is locked (another process held the write lock for more than {timeout:g} s)")
    error = OperationalError(*cause.args)
    error.__cause__ = cause
    return error


def _pool_for(name: DatabaseName) -> list[sqlite3.Connection]:
    with _registry_lock:
        return _pools.setdefault(str(name), [])


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


class RetryingCursor(base.SQLiteCursorWrapper):
    """A statement that meets another process's write lock is retried, briefly and
    often, until the connection's timeout (a BUSY statement did nothing: safe)."""

    timeout: float = 30.0

    def _retry(self, run: Callable[[], T]) -> T:
        deadline = None
        for attempt in range(1_000_000):
            try:
                return run()
            except sqlite3.OperationalError as exc:
                if not _locked(exc):
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.timeout
                if now > deadline:
                    raise
                time.sleep(RETRY_STEPS[min(attempt, len(RETRY_STEPS) - 1)])
        raise _locked_error(self.timeout)  # not reached: the deadline comes first

    # Django's signatures (params: any iterable), which sqlite3.Cursor's do not allow (django-stubs ignores it too).
    def execute(  # type: ignore[override]
            self, query: str, params: Iterable[Any] | None = None) -> base.SQLiteCursorWrapper:
        return self._retry(lambda: super(RetryingCursor, self).execute(query, params))

    def executemany(  # type: ignore[override]
            self, query: str, param_list: Iterable[Iterable[Any]]) -> base.SQLiteCursorWrapper:
        param_list = list(param_list)
        return self._retry(lambda: super(RetryingCursor, self).executemany(query, param_list))


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_write_lock = False

    def get_new_connection(self, conn_params: Any) -> sqlite3.Connection:
        if not self.is_in_memory_db():
            pool = _pool_for(self.settings_dict["NAME"])
            with _registry_lock:
                if pool:
                    return pool.pop()
        connection: sqlite3.Connection = super().get_new_connection(conn_params)
        connection.execute("PRAGMA busy_timeout = 0")  # RetryingCursor waits instead
        # The worker's thread checkpoints outside the write lock (checkpoints.py); a
        # commit copies the log itself only past this, a net when no worker runs.
        connection.execute(f"PRAGMA wal_autocheckpoint = {checkpoints.SAFETY_PAGES}")
        return connection

    def start_checkpoints(self) -> checkpoints.Checkpointer | None:
        """This process's background checkpoints of this database (the worker loop starts
        them), or None in memory."""
        if self.is_in_memory_db():
            return None
        return checkpoints.start(str(self.settings_dict["NAME"]))

    def create_cursor(self, name: str | None = None) -> RetryingCursor:
        cursor: RetryingCursor = self.connection.cursor(factory=RetryingCursor)
        cursor.timeout = self.settings_dict["OPTIONS"].get("timeout", 30)
        return cursor

    def _start_transaction_under_autocommit(self) -> None:
        name = self.settings_dict["NAME"]
        if not self.is_in_memory_db():
            timeout = self.settings_dict["OPTIONS"].get("timeout", 30)
            deadline = time.monotonic() + timeout
            # Bounded: a stuck holder in this process degrades to SQLite's own locking.
            self._holds_write_lock = _lock_for(name).acquire(timeout=timeout)
            if self._holds_write_lock and not _process_lock_for(name).acquire(deadline - time.monotonic()):
                self._holds_write_lock = False
                _lock_for(name).release()
                raise _locked_error(timeout)
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in Django, absent from django-stubs
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self) -> None:
        if self._holds_write_lock:
            self._holds_write_lock = False
            name = self.settings_dict["NAME"]
            _process_lock_for(name).release()
            _lock_for(name).release()

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # private in Django, absent from django-stubs
        finally:
            self._release_write_lock()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # private in Django, absent from django-stubs
        finally:
            self._release_write_lock()

    def _close(self) -> None:
        try:
            if self._can_pool():
                pool = _pool_for(self.settings_dict["NAME"])
                with _registry_lock:
                    if len(pool) < POOL_SIZE:
                        pool.append(self.connection)
                        return None
            super()._close()  # type: ignore[misc]  # private in Django, absent from django-stubs
        finally:
            self._release_write_lock()

    def _can_pool(self) -> bool:
        return (self.connection is not None and not self.is_in_memory_db()
                and not self.connection.in_transaction and self.connection.isolation_level is None)
