"""A connection broken by a fault distrusts the process's other connections opened before
it: their threads replace them at their next step instead of probing them (a probe of a
connection to a lost primary waits out the TCP user timeout; agentloop.core.db_connection).
A fault that leaves the connection sound (a cancelled statement, SQLite's lock) does not."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import OperationalError, connection

from conversations.worker.dbthread import run_step
from tests.conftest import is_postgres

pytestmark = pytest.mark.django_db(transaction=True)


class Thread:
    """One thread with its own connection, as the worker's database helpers have."""

    def __init__(self):
        self.executor = ThreadPoolExecutor(1)

    def step(self, fn):
        return self.executor.submit(run_step, fn).result(timeout=30)

    def connection_id(self):
        """The open connection's identity on this thread: its backend's pid on PostgreSQL."""
        return self.step(lambda: connection.cursor().execute("SELECT 1") and backend_id())

    def close(self):
        self.executor.submit(lambda: connection.close()).result(timeout=30)
        self.executor.shutdown()


def backend_id():
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]
    return id(connection.connection)


@pytest.fixture
def threads():
    made = []

    def make():
        made.append(Thread())
        return made[-1]

    yield make
    for thread in made:
        thread.close()


def broken(thread):
    """The thread's backend terminated from outside; its next step meets the fault."""
    pid = thread.connection_id()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):
        thread.step(lambda: connection.cursor().execute("SELECT 1"))


def cancelled_statement():
    with connection.cursor() as cursor:
        if is_postgres():
            cursor.execute("SET statement_timeout = 50")
            try:
                cursor.execute("SELECT pg_sleep(2)")
            finally:
                cursor.execute("SET statement_timeout = 0")
        else:  # what SQLite says when a writer held the lock past SQLITE_TIMEOUT
            raise OperationalError("database is locked")


def test_a_broken_connection_has_the_others_opened_before_it_replaced_unprobed(threads):
    if not is_postgres():  # scripts/test.sh runs it in the PostgreSQL pass only (tests/conftest.py ONE_PASS)
        pytest.skip("a connection to a SQLite file is not broken by a lost host (the next test: its lock)")
    a, b = threads(), threads()
    before = b.connection_id()
    assert b.connection_id() == before  # no fault: a thread keeps its connection
    broken(a)
    after = b.connection_id()
    assert after != before
    with connection.cursor() as cursor:  # replaced, not probed: the old session is gone
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [before])
        assert cursor.fetchone()[0] == 0
    assert b.connection_id() == after  # one replacement per fault, not one per step
    reconnected = a.connection_id()
    assert a.connection_id() == reconnected  # the thread that met the fault reconnected once
    c = threads()  # a connection first opened after the fault is trusted
    first = c.connection_id()
    assert c.connection_id() == first


def test_a_fault_that_leaves_its_connection_sound_distrusts_no_other(threads):
    a, b = threads(), threads()
    before = b.connection_id()
    with pytest.raises(OperationalError):
        a.step(cancelled_statement)
    assert b.connection_id() == before
