"""SQLite's WAL checkpoints, out of the write lock.

In WAL mode a commit that leaves the log longer than `wal_autocheckpoint` pages (1,000 by
default) copies the log into the database file before it returns: inside the commit, so
inside this backend's write lock (base.py), while every writer of every process waits.
Under the peer's workload paced at 560 messages/s (stop 54), 470 of 21,000 commits took
over 5 ms, 3.3 s of the write lock in 95 s, the longest 92 ms; on a database grown to a
week of traffic the copy scatters over a bigger file.

So the worker loop's process runs this thread: every INTERVAL it checkpoints on a
connection of its own, PASSIVE (it copies what no reader still needs, and neither waits
for nor blocks a writer), without the write lock. Every connection's automatic checkpoint
is moved to SAFETY_PAGES, a net for a database with no worker running (the web process
alone checkpoints then, as before, with a longer log).
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from agentloop.core.redaction import redact

logger = logging.getLogger(__name__)

INTERVAL = 0.2  # seconds: ~1,000 pages of log at the peer's 560 messages/s
SAFETY_PAGES = 10_000  # a writer's own checkpoint past this (40 MB of log at 4 KiB pages)
MAX_BACKOFF = 5.0  # seconds between tries while the database cannot be opened or checkpointed


class Checkpointer:
    """The background checkpoints of one database file, in one daemon thread."""

    def __init__(self, path: str, interval: float = INTERVAL) -> None:
        self.path = path
        self.interval = interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sqlite-checkpoints", daemon=True)
        self.checkpoints = 0  # PASSIVE checkpoints run

    def start(self) -> Checkpointer:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        wait, failing = self.interval, False
        while not self.stopping.wait(wait):
            try:
                if connection is None:
                    connection = sqlite3.connect(self.path, timeout=0, isolation_level=None,
                                                 check_same_thread=False)
                self.checkpoint(connection)
            except sqlite3.Error as error:
                if connection is not None:
                    connection.close()
                    connection = None
                if not failing:  # once per fault, not once per try
                    logger.warning("sqlite checkpoints failing, retrying with backoff: %s", redact(str(error)))
                failing, wait = True, min(MAX_BACKOFF, wait * 2)
                continue
            if failing:
                logger.info("sqlite checkpoints running again")
            failing, wait = False, self.interval
        if connection is not None:
            connection.close()

    def checkpoint(self, connection: sqlite3.Connection) -> None:
        # Its row (busy, pages in the log, pages copied) is not an error either way: busy
        # means another checkpoint ran, and pages a reader still needs wait for the next.
        connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.checkpoints += 1


_running: dict[str, Checkpointer] = {}
_lock = threading.Lock()


def start(path: str, interval: float = INTERVAL) -> Checkpointer:
    """This process's checkpointer for the database at `path`, started once."""
    with _lock:
        if path not in _running:
            _running[path] = Checkpointer(path, interval).start()
        return _running[path]
