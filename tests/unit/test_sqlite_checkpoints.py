"""SQLite's WAL checkpoints run by the worker's thread, out of the write lock
(agentloop/core/sqlite/checkpoints.py): commits no longer copy the log themselves, the log
stays short while a writer goes on, and a database the thread cannot reach is logged once
and tried again with backoff until it can."""

import logging
import os
import sqlite3
import time

from django.db.utils import ConnectionHandler

from agentloop.core.sqlite import checkpoints
from agentloop.core.sqlite.checkpoints import Checkpointer
from tests.conftest import wait_until

ROW = "x" * 3000  # about one page per row


def writer(path):
    """A writer as the product's connections are set: WAL, commits copying nothing below SAFETY_PAGES."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA wal_autocheckpoint={checkpoints.SAFETY_PAGES}")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
    return db


def write_pages(db, pages):
    for _ in range(pages):
        db.execute("INSERT INTO t (body) VALUES (?)", (ROW,))


def wal_pages(path):
    return os.path.getsize(f"{path}-wal") // 4096


def file_pages(path):
    return os.path.getsize(path) // 4096


def test_the_products_connections_leave_the_copy_to_the_thread(tmp_path, django_db_blocker):
    """A connection of this backend (its own file, either pass) copies the log only past
    SAFETY_PAGES; the worker's call starts one thread per database and process."""
    path = str(tmp_path / "p.sqlite3")
    wrapper = ConnectionHandler({"default": {"ENGINE": "agentloop.core.sqlite", "NAME": path}})["default"]
    with django_db_blocker.unblock():
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("PRAGMA wal_autocheckpoint")
                assert cursor.fetchone()[0] == checkpoints.SAFETY_PAGES
            started = wrapper.start_checkpoints()
            assert started is checkpoints.start(path), "one thread per database and process"
            assert started.thread.is_alive()
        finally:
            running = checkpoints._running.pop(path, None)
            if running:
                running.stop()
            wrapper.close()


def test_without_the_thread_the_log_grows_with_the_writes(tmp_path):
    """The reference for the next test: nobody copies the log below SAFETY_PAGES."""
    path = str(tmp_path / "none.sqlite3")
    db = writer(path)
    write_pages(db, 3000)
    assert wal_pages(path) >= 3000
    assert file_pages(path) < 10, "nothing copied into the database file"
    db.close()


def test_with_the_thread_the_log_stays_short_while_a_writer_goes_on(tmp_path):
    path = str(tmp_path / "bg.sqlite3")
    db = writer(path)
    thread = Checkpointer(path, interval=0.02).start()
    try:
        for _ in range(30):
            write_pages(db, 100)
            time.sleep(0.05)  # a writer that pauses, as the product's do between transactions
        assert thread.checkpoints > 0
        # Copied into the file while the writer went on, no commit doing it (SAFETY_PAGES),
        # and the log reused from its start: it never held the 3,000 pages.
        assert file_pages(path) >= 2500, file_pages(path)
        assert wal_pages(path) < 1500, wal_pages(path)
        assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 3000
    finally:
        thread.stop()
        db.close()


def test_a_database_it_cannot_read_is_logged_once_then_checkpointed_when_it_can(tmp_path, caplog):
    path = tmp_path / "late.sqlite3"
    path.write_bytes(b"not a database, " * 512)  # "file is not a database" on every try
    thread = Checkpointer(str(path), interval=0.01)
    with caplog.at_level(logging.INFO, logger="agentloop.core.sqlite.checkpoints"):
        thread.start()
        try:
            time.sleep(0.5)  # tries at 0.01, 0.02, 0.04 … s: several in this time, backing off
            failures = [r for r in caplog.records if "failing" in r.getMessage()]
            assert len(failures) == 1, [r.getMessage() for r in caplog.records]
            assert thread.checkpoints == 0
            path.unlink()
            db = writer(str(path))
            write_pages(db, 10)
            wait_until(lambda: thread.checkpoints > 0, timeout=10)
            assert any("running again" in r.getMessage() for r in caplog.records)
            db.close()
        finally:
            thread.stop()


def test_stop_ends_the_thread(tmp_path):
    path = str(tmp_path / "stop.sqlite3")
    writer(path).close()
    thread = Checkpointer(path, interval=0.01).start()
    thread.stop()
    assert not thread.thread.is_alive()
