"""PostgreSQL binds parameters on the server and prepares what a connection repeats
(DATABASE_PREPARED_STATEMENTS), except behind a transaction pooler."""

import json
import subprocess
import sys

from django.db import connection

from tests.conftest import BASE_DIR


def options_under(**env):
    """The database OPTIONS settings.py makes of this environment, in a fresh process."""
    code = ("import django, json; django.setup(); from django.conf import settings; "
            "o = settings.DATABASES['default']['OPTIONS']; "
            "print(json.dumps({k: o.get(k) for k in ('server_side_binding', 'prepare_threshold')}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, capture_output=True, text=True, timeout=60,
                          env={"DJANGO_SETTINGS_MODULE": "agentloop.settings", "AGENTLOOP_LOCAL_SECRET_KEY": "true",
                               "PATH": "/usr/bin:/bin", "DATABASE_URL": "postgres://u@127.0.0.1:1/x", **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_by_default_off_behind_a_transaction_pooler_and_either_way_when_said():
    on = {"server_side_binding": True, "prepare_threshold": 5}
    off = {"server_side_binding": None, "prepare_threshold": None}
    assert options_under() == on
    assert options_under(DATABASE_TRANSACTION_POOLER="true") == off
    assert options_under(DATABASE_TRANSACTION_POOLER="true", DATABASE_PREPARED_STATEMENTS="true") == on
    assert options_under(DATABASE_PREPARED_STATEMENTS="false") == off


def test_a_statement_run_a_fifth_time_is_prepared_on_postgresql(db):
    if connection.vendor != "postgresql":  # SQLite's own statement cache needs no setting
        assert "server_side_binding" not in connection.settings_dict["OPTIONS"]
        return
    with connection.cursor() as cursor:
        for n in range(6):
            cursor.execute("SELECT %s::int + 41", [n])
            assert cursor.fetchone() == (n + 41,)
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT $1::int + 41'")
        assert cursor.fetchone() == (1,)
