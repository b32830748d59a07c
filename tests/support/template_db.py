"""Each pytest process's test database, copied from a migrated template (tests only).

`make test` starts a dozen pytest processes (three per pass in the busy phase, two in the
serial one, one in the alone one), and each migrated a test database of its own from
nothing: about 3 s of CPU on SQLite (against 0.2 s for a `migrate` with nothing to do),
more on PostgreSQL, while a phase that has just started waits for it. Here the first
process of a kind migrates as before and keeps a copy of the result, the template; every
later one copies the template (a file copy on SQLite, `CREATE DATABASE … TEMPLATE` on
PostgreSQL), then lets Django's `migrate` check it (nothing left to apply) as with
`--reuse-db`. The template is named by a digest of every app's migrations on disk (the
packages' too), so a changed migration builds a new one; a file lock (one for SQLite,
one per PostgreSQL server) keeps two processes from building it at once. The database a
test sees is what a fresh `migrate` makes, row for row (content types and permissions
included).
"""

import atexit
import fcntl
import hashlib
import re
import sqlite3
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import OperationalError, connections

BASE_DIR = Path(__file__).resolve().parents[2]
LOCKS = BASE_DIR / "var"  # test-template-<where>.lock (lock_for)
TEMPLATE_PREFIX = "test_template_"
OBJECT_IN_USE = "55006"  # SQLSTATE: the source database has other sessions


def migrations_digest(sha):
    """`sha` fed every app's migrations on disk (ours and the packages', by name and text):
    what a migrated database is made of (tests.bench.grown_db keys its copies by it too)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    for key in sorted(loader.disk_migrations):
        sha.update(repr(key).encode())
        sha.update(Path(sys.modules[loader.disk_migrations[key].__module__].__file__).read_bytes())
    return sha


def remove_sqlite(path):
    """A SQLite file and what lies beside it: its log, its shared memory, its writers' lock."""
    for suffix in ("", "-wal", "-shm", "-writelock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def lock_for(connection):
    """One lock per place a template lives: SQLite's folder (var/), a PostgreSQL server. With
    one for all, the backfill's SQLite process waited 48 s (at idle priority) while the
    backfill's PostgreSQL process built its own cluster's template (scripts/test.sh)."""
    settings = connection.settings_dict
    where = "sqlite" if connection.vendor == "sqlite" else \
        f"postgresql-{settings.get('HOST') or 'socket'}-{settings.get('PORT') or 5432}"
    return LOCKS / f"test-template-{re.sub(r'[^A-Za-z0-9.]+', '-', where)}.lock"


@contextmanager
def held(path):
    path.parent.mkdir(exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(setup):
    """Ready the default database's test database for `setup(keepdb)` (Django's
    setup_databases): copied from the template, then `setup(True)` checks it; without a
    template, `setup(False)` migrates it and the result becomes the template. Other
    backends (and SQLite in memory) go the usual way."""
    connection = connections["default"]
    vendor = connection.vendor
    test_name = connection.creation._get_test_db_name()  # before setup_databases renames the connection's
    if vendor not in ("sqlite", "postgresql") or test_name == ":memory:" or "mode=memory" in test_name:
        return setup(False)
    sqlite = vendor == "sqlite"
    name = f"{TEMPLATE_PREFIX}{migrations_digest(hashlib.sha256()).hexdigest()[:16]}"
    with held(lock_for(connection)):
        if (_copy_sqlite if sqlite else _copy_postgres)(connection, test_name, name):
            return setup(True)
        built = setup(False)  # under the lock: no second process builds the same template
        (_keep_sqlite if sqlite else _keep_postgres)(connection, test_name, name)
        return built


# --- SQLite: a file beside the test databases --------------------------------------------

def _sqlite_template(test_name, name):
    return Path(test_name).with_name(f"{name}.sqlite3")


def _copy_sqlite(connection, test_name, name):
    template = _sqlite_template(test_name, name)
    if not template.exists():
        return False
    remove_sqlite(test_name)
    _backup(template, test_name)
    return True


def _keep_sqlite(connection, test_name, name):
    template = _sqlite_template(test_name, name)
    connection.close()
    for old in template.parent.glob(f"{TEMPLATE_PREFIX}*.sqlite3"):
        old.unlink(missing_ok=True)
    partial = template.with_name(f"{template.name}.partial")
    partial.unlink(missing_ok=True)
    _backup(test_name, partial)
    partial.replace(template)


def _backup(source, target):
    """SQLite's own online backup: a consistent copy whatever its write-ahead log holds."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


# --- PostgreSQL: a database on the same server ---------------------------------------------

def _copy_postgres(connection, test_name, name):
    quote = connection.ops.quote_name
    with connection.creation._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if cursor.fetchone() is None:
            return False
        cursor.execute(f"DROP DATABASE IF EXISTS {quote(test_name)} WITH (FORCE)")  # a killed run's sessions
        _create_from(cursor, f"CREATE DATABASE {quote(test_name)} TEMPLATE {quote(name)}")
    return True


def _create_from(cursor, create, deadline=60.0):
    """CREATE DATABASE … TEMPLATE, again while someone else is in the template: PostgreSQL
    copies a database only while nobody is connected to it, and scripts/test.sh's
    copy_templates `pg_dump`s the template onto the backfill's cluster just as the serial
    phase's processes copy it (one CI run failed two tests' setups so, "There is 1 other
    session using the database": PostgreSQL waits 5 s for it, and the dump, at idle priority
    beside the tests, took longer). The deadline bounds a session that stays."""
    started, pause = time.monotonic(), 0.1
    while True:
        try:
            cursor.execute(create)
            return
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) != OBJECT_IN_USE \
                    or time.monotonic() - started + pause > deadline:
                raise
            if pause == 0.1:
                print(f"template_db: the template is in use; trying again for up to {deadline:.0f} s",
                      file=sys.stderr)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def forget_sqlite_files_on_exit() -> None:
    """The SQLite test database's side files (its log, shared memory, writers' lock),
    removed when this process ends: Django removes only the database file, and each pytest
    process names its own (agentloop/settings.py), so nothing would reuse them."""
    connection = connections["default"]
    if connection.vendor == "sqlite" and connection.settings_dict["NAME"].endswith(".sqlite3"):
        atexit.register(remove_sqlite, connection.settings_dict["NAME"])


def drop_by_force() -> bool:
    """Drop the default connection's test database on PostgreSQL, its sessions ended
    (WITH FORCE); True when done."""
    connection = connections["default"]
    name = connection.settings_dict["NAME"]
    # A failed destroy_test_db leaves the test database's name in place; never any other.
    if connection.vendor != "postgresql" or not name.startswith("test_"):
        return False
    connection.close()
    with connection.creation._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)} WITH (FORCE)")
    return True


def _keep_postgres(connection, test_name, name):
    quote = connection.ops.quote_name
    connection.close()  # a database is copied only while nobody is connected to it
    with connection.creation._nodb_cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{TEMPLATE_PREFIX}%"])
        for (old,) in cursor.fetchall():
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(old)}")
        cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(test_name)}")
