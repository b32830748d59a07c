"""SQLite with one in-process queue for write transactions.

With `transaction_mode=IMMEDIATE` every atomic block takes SQLite's write lock at
BEGIN. Threads of one process that find it taken fall into SQLite's busy handler,
which sleeps in growing steps (1, 2, 5, 10 … 100 ms) — under a burst of webhooks
that backoff, not the work, dominated. Here threads of the same process queue on a
plain mutex instead and wake the instant the holder commits; other processes still
meet SQLite's own lock and busy timeout.

It also keeps one idle connection per database open for the life of the process:
when the last connection to a WAL database closes, SQLite checkpoints and deletes the
WAL. Under ASGI every request runs in a fresh thread with a fresh connection, so
without this every single request paid a full checkpoint on close.
"""

import sqlite3
import threading

from django.db.backends.sqlite3 import base

_write_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


_keepers: dict[str, sqlite3.Connection] = {}


def _lock_for(name):
    with _registry_lock:
        return _write_locks.setdefault(str(name), threading.Lock())


def _keep_open(name):
    with _registry_lock:
        if str(name) not in _keepers:
            _keepers[str(name)] = sqlite3.connect(str(name), check_same_thread=False)


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_write_lock = False

    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        if not self.is_in_memory_db():
            _keep_open(self.settings_dict["NAME"])  # after the first: the file exists, in WAL mode
        return connection

    def _start_transaction_under_autocommit(self):
        lock = _lock_for(self.settings_dict["NAME"])
        # Bounded: a stuck holder degrades to SQLite's own waiting, never a hang.
        self._holds_write_lock = lock.acquire(timeout=self.settings_dict["OPTIONS"].get("timeout", 30))
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self):
        if self._holds_write_lock:
            self._holds_write_lock = False
            _lock_for(self.settings_dict["NAME"]).release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_write_lock()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_write_lock()
