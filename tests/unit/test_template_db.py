"""tests.support.template_db: a template someone is connected to for a while (the
backfill's pg_dump of it, at idle priority) is copied once they leave."""

import threading
import time

import psycopg
import pytest
from django.db import connection

from tests.support import template_db

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                reason="PostgreSQL copies a database only while nobody is in it")


def _url(name):
    settings = connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=name, user=settings["USER"], password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None, port=settings["PORT"] or None)


@pytest.fixture
def source(db):
    name = f"template_db_source_{time.monotonic_ns()}"
    with connection.creation._nodb_cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    yield name
    with connection.creation._nodb_cursor() as cursor:
        for each in (name, f"{name}_copy"):
            cursor.execute(f"DROP DATABASE IF EXISTS {each} WITH (FORCE)")


def _exists(name):
    with connection.creation._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        return cursor.fetchone() is not None


def test_a_template_in_use_for_a_while_is_copied_once_its_session_leaves(source, capfd):
    visitor = psycopg.connect(_url(source))
    # Longer than PostgreSQL's own wait (CREATE DATABASE tries for 5 s, then fails).
    leave = threading.Timer(5.5, visitor.close)
    leave.start()
    try:
        began = time.monotonic()
        with connection.creation._nodb_cursor() as cursor:
            template_db._create_from(cursor, f"CREATE DATABASE {source}_copy TEMPLATE {source}", deadline=20)
        waited = time.monotonic() - began
    finally:
        leave.cancel()
        visitor.close()
    assert _exists(f"{source}_copy")
    assert 5 < waited < 15
    assert capfd.readouterr().err.count("the template is in use") == 1  # once per wait, not per try
