"""An empty database beside the test database, on the same server and engine, under a
connection alias of its own (tests only): for a migration test that walks a few
migrations forward and back from nothing, rather than unapplying and applying again every
later migration of the shared test database (which a failure half-way left migrated back
for every later test of its process). About as much CPU either way; and migrating a
database other than `default` is what showed the data migrations ignoring
`migrate --database`."""

import copy
import time
from contextlib import contextmanager

from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import load_backend

ALIAS = "fresh"


@contextmanager
def fresh_database(folder):
    """Yields the alias of a new, empty database (a file in `folder` on SQLite); dropped
    after."""
    default = connections["default"]
    settings = copy.deepcopy(default.settings_dict)
    postgres = default.vendor == "postgresql"
    name = f"test_fresh_{time.monotonic_ns()}" if postgres else str(folder / "fresh.sqlite3")
    if postgres:
        with default.creation._nodb_cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {default.ops.quote_name(name)}")
    settings["NAME"] = name
    # A connection made here, not an alias of the settings: Django's test case lets a test
    # use only the settings' aliases it declares, and any connection made on the fly.
    connections[ALIAS] = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, ALIAS)
    try:
        yield ALIAS
    finally:
        connections[ALIAS].close()
        del connections[ALIAS]
        if postgres:
            with default.creation._nodb_cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {default.ops.quote_name(name)} WITH (FORCE)")


def migrate(alias, targets):
    """The database of `alias` migrated to `targets` (forwards or backwards)."""
    MigrationExecutor(connections[alias]).migrate(targets)


def rows_at(alias, targets, label):
    """The rows of `label` ("app.Model") in `alias`, through that model as the migrations up
    to `targets` leave it."""
    state = MigrationExecutor(connections[alias]).loader.project_state(targets)
    return state.apps.get_model(label).objects.using(alias)


def latest(alias):
    """Every app's last migration."""
    return MigrationExecutor(connections[alias]).loader.graph.leaf_nodes()
