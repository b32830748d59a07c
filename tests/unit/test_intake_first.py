"""On SQLite the intake's write transactions go first (agentloop.core.sqlite.base, item 4):
a process that yields (the worker) waits while one of the intake's (the web's) wants or
holds the write lock, at most INTAKE_GRACE, and not at all when none does.

flock locks belong to an open file, not to a process: two _Intake objects on one path
are two processes' views of it. The last test runs our backend on a file of its own,
whatever database the suite uses."""

import threading
import time

import pytest
from django.db.utils import ConnectionHandler

from agentloop.core.sqlite import base

GRACE = 0.05


@pytest.fixture
def intake_file(tmp_path):
    path = str(tmp_path / "db.sqlite3-intake")
    return lambda: base._Intake(path)


def waited(yielder, grace):
    began = time.monotonic()
    yielder.let_go_first(grace)
    return time.monotonic() - began


def test_with_no_intake_waiting_a_yielder_goes_at_once(intake_file):
    assert waited(intake_file(), 5.0) < 0.5


def test_a_yielder_waits_for_the_intake_at_most_its_grace(intake_file):
    web, worker = intake_file(), intake_file()
    web.want()
    assert GRACE <= waited(worker, GRACE) < 1.0
    web.done()
    assert waited(worker, 5.0) < 0.5


def test_the_yielder_goes_as_soon_as_the_last_intake_transaction_ends(intake_file):
    """Two threads of the web want the lock: the file stays held until both are done."""
    web, worker = intake_file(), intake_file()
    web.want()
    web.want()
    web.done()
    assert waited(worker, GRACE) >= GRACE  # one intake transaction still wants it
    threading.Timer(0.2, web.done).start()
    spent = waited(worker, 10.0)
    assert 0.15 <= spent < 2.0


@pytest.fixture
def own_sqlite(tmp_path, django_db_blocker):
    """Our backend on a file of its own (not the suite's database: pytest-django's block lifted for it)."""
    handler = ConnectionHandler({"default": {"ENGINE": "agentloop.core.sqlite", "NAME": str(tmp_path / "db.sqlite3")}})
    connection = handler["default"]
    with django_db_blocker.unblock():
        yield connection, str(tmp_path / "db.sqlite3-intake")
        connection.close()


def begin(connection):
    connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def end(connection):
    connection.commit()
    connection.set_autocommit(True)


def test_an_intake_transaction_holds_the_file_from_its_begin_to_its_commit(own_sqlite, monkeypatch):
    connection, path = own_sqlite
    monkeypatch.setattr(base, "_role", "intake")
    worker = base._Intake(path)
    begin(connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE t (x int)")
        assert waited(worker, GRACE) >= GRACE
    finally:
        end(connection)
    assert waited(worker, 5.0) < 0.5


def test_a_yielding_transaction_waits_for_the_intake_then_writes(own_sqlite, monkeypatch):
    connection, path = own_sqlite
    monkeypatch.setattr(base, "_role", "yields")
    monkeypatch.setattr(base, "INTAKE_GRACE", GRACE)
    web = base._Intake(path)
    web.want()
    began = time.monotonic()
    begin(connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE t (x int)")
            cursor.execute("INSERT INTO t VALUES (1)")
    finally:
        end(connection)
        web.done()
    assert time.monotonic() - began >= GRACE
    with connection.cursor() as cursor:
        cursor.execute("SELECT x FROM t")
        assert cursor.fetchall() == [(1,)]
