"""A cheaper flush between transactional tests (tests only).

After each test that commits (`transactional_db`, every end-to-end test), Django empties
every table and sends post_migrate, which makes the content types, the permissions and the
console's two roles again. On PostgreSQL that flush took 92 ms, 68 of them post_migrate's
136 statements and 24 the TRUNCATE of every table (a DELETE of the same tables: 1.3 ms);
a pass runs it a few hundred times, its CPU shared with the tests beside it.

Here the rows post_migrate makes are taken once, after the first flush made them, and put
back as they were after each later one (a test may have added a group or changed a role's
permissions); the other tables are emptied with DELETE in one transaction (every foreign
key is deferred, and no table has a trigger of ours), and post_migrate is not sent. What
a test finds is what Django's flush left: every table empty but those rows.
"""

from django.db import connections, transaction
from django.test.testcases import TransactionTestCase

# What post_migrate makes (django.contrib.contenttypes, django.contrib.auth and
# agentloop.console.roles), in the order they can be put back in.
MADE_BY_POST_MIGRATE = ("django_content_type", "auth_permission", "auth_group", "auth_group_permissions")

_snapshots: dict[str, list[tuple[str, list[str], list[tuple]]]] = {}  # per database alias
_django_teardown = TransactionTestCase._fixture_teardown


def install():
    TransactionTestCase._fixture_teardown = _fixture_teardown


def _fixture_teardown(self):
    if self.available_apps is not None or self.serialized_rollback:
        return _django_teardown(self)  # Django's own rules for those; no test here uses them
    for alias in self._databases_names(include_mirrors=False):
        if alias not in _snapshots:
            _django_teardown(self)
            _snapshots[alias] = _snapshot(connections[alias])
        else:
            _flush(connections[alias], _snapshots[alias])


def _snapshot(connection):
    taken = []
    with connection.cursor() as cursor:
        for table in MADE_BY_POST_MIGRATE:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            taken.append((table, [column[0] for column in cursor.description], cursor.fetchall()))
    return taken


def _flush(connection, snapshot):
    quote = connection.ops.quote_name
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    emptied = [f"DELETE FROM {quote(table)};" for table in tables]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET CONSTRAINTS ALL DEFERRED; {' '.join(emptied)}")  # one round trip
        else:
            for statement in emptied:  # SQLite runs one statement per call
                cursor.execute(statement)
        for table, columns, rows in snapshot:
            if rows:  # one statement per table (a few hundred rows: within SQLite's 32,766 parameters)
                names = ", ".join(quote(column) for column in columns)
                row = f"({', '.join(['%s'] * len(columns))})"
                cursor.execute(f"INSERT INTO {quote(table)} ({names}) VALUES {', '.join([row] * len(rows))}",
                               [value for values in rows for value in values])
