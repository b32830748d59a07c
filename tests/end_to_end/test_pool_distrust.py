"""With DATABASE_POOL on, a fault distrusts the pool's connections too: each is stamped at
its checkout, not when it opened, so a pooled connection to a lost host would be handed
to the next request and probed (agentloop.core.db_connection._drain_pool). A web process
with a pool of four, one of its backends terminated: the request that meets it answers
503, and the pool's other three connections from before the fault are closed and
replaced, never used again; the process answers 200 at once."""

import httpx
import pytest
from django.db import connection

from tests.conftest import is_postgres, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def web_backends():
    """The backends of the test database other than this test's own: the web process's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        return {pid for (pid,) in cursor.fetchall()}


def test_a_fault_drains_the_pool_of_the_connections_opened_before_it(processes):
    if not is_postgres():  # scripts/test.sh runs it in the PostgreSQL pass only (tests/conftest.py ONE_PASS)
        pytest.skip("the pool is PostgreSQL's (SQLite ignores DATABASE_POOL)")
    # Without the pool's own check at each checkout (CONN_HEALTH_CHECKS), which would find
    # the terminated backend first and replace it silently: here a request meets the fault.
    web = processes.web(DATABASE_POOL="true", DATABASE_POOL_MIN_SIZE="4", DATABASE_POOL_MAX_SIZE="4",
                        CONN_HEALTH_CHECKS="false")
    before = wait_until(lambda: four if len(four := web_backends()) == 4 else None, message="the pool's four")
    lost = min(before)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [lost])
    with httpx.Client(base_url=web.url, timeout=10) as http:
        # The pool lends its connections in turn: within four requests one meets the dead one.
        answers = [http.get("/healthz").status_code for _ in range(4)]
        assert 503 in answers and set(answers) <= {200, 503}, answers
        wait_until(lambda: not web_backends() & before, message="the pool's connections from before the fault closed")
        assert [http.get("/healthz").status_code for _ in range(8)] == [200] * 8
    assert not web_backends() & before  # none of them lent out again
