"""`manage.py backup PATH`: a consistent copy of the database while the product runs.

SQLite: the online backup API (sqlite3.Connection.backup), page by page, consistent at
its end. PostgreSQL: `pg_dump -Fc` (a custom-format archive for `pg_restore`).

A reply the ledger holds open in the copy may be sent after the copy was taken: in the
SQLite copy each open row is marked as "its send may have started" (the ledger's own
rule), so a product restored from it resends it labelled, never silently twice. A buffer
or turn in flight in the copy runs again after a restore, and its reply may have gone out
after the copy was taken too: the copy gets a restore point (delivery.models.RestorePoint,
the newest turn and buffer it holds), and the replies of those turns are written
labelled. For PostgreSQL, `manage.py backup --mark-restored` runs both steps on the
restored database.

The copy holds the channels' tokens and secrets (what a restore needs), so it is
created readable by its owner only, from its first byte (0600, whatever the umask).
It holds no admin session: a copy that leaks signs no one in (the sessions' table is
there, empty; after a restore everyone logs in again). pg_dump connects as the product
does: every option of DATABASE_URL (sslmode, sslrootcert, connect_timeout, options…).
"""

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from django.contrib.sessions.models import Session
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from agentloop.core.secret_file import create_private
from conversations.models import MessageBuffer, Turn
from delivery.models import OutboundMessage, OutboundState, RestorePoint

OPEN = (OutboundState.PENDING, OutboundState.FAILED, OutboundState.ATTEMPTING)


def mark_sql() -> str:
    table = OutboundMessage._meta.db_table
    states = ", ".join(f"'{s}'" for s in OPEN)
    return f"UPDATE {table} SET chunks_started = chunks_delivered + 1 WHERE state IN ({states})"


def restore_point_sql() -> str:
    """Parameters: the restore point's time."""
    turns, buffers = Turn._meta.db_table, MessageBuffer._meta.db_table
    return (f"INSERT INTO {RestorePoint._meta.db_table} (at, last_turn_id, last_buffer_id) "
            f"SELECT %s, (SELECT COALESCE(MAX(id), 0) FROM {turns}), (SELECT COALESCE(MAX(id), 0) FROM {buffers})")


class Command(BaseCommand):
    help = "Back the database up to PATH while the product runs (docs/operations.md#backups)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", nargs="?", default="")
        parser.add_argument("--mark-restored", action="store_true",
                            help="On a database just restored: label the resend of every open reply.")
        parser.add_argument("--timeout", type=float, default=6 * 3600,
                            help="PostgreSQL: seconds pg_dump may take in all (default 6 hours).")

    def handle(self, *args: Any, path: str, mark_restored: bool, **options: Any) -> None:
        if mark_restored:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(mark_sql())
                self.stdout.write(f"{cursor.rowcount} open ledger rows will be resent labelled")
                cursor.execute(restore_point_sql(), [timezone.now()])
            point = RestorePoint.objects.first()
            assert point is not None, "the restore point was just written"
            self.stdout.write(f"replies of turns up to {point.last_turn_id} and buffers up to "
                              f"{point.last_buffer_id} will be sent labelled")
            return
        if not path:
            raise CommandError("give the backup's PATH")
        target = Path(path)
        try:
            fd = create_private(target)
        except FileExistsError:
            raise CommandError(f"{target} exists: choose a new path") from None
        try:
            if connection.vendor == "sqlite":
                os.close(fd)  # SQLite opens the empty file as an empty database: its mode stays
                self.sqlite(target)
            else:
                self.postgres(target, fd, options["timeout"])
        except BaseException:
            target.unlink(missing_ok=True)  # no partial copy left to be taken for a backup
            raise
        self.stdout.write(f"backed up to {target}")

    def sqlite(self, target: Path) -> None:
        connection.ensure_connection()
        source = connection.connection
        copy = sqlite3.connect(target)
        at = timezone.now().replace(tzinfo=None).isoformat(" ")  # as Django's SQLite backend stores it (UTC)
        try:
            source.backup(copy)  # one step: a read snapshot (WAL: writers go on meanwhile)
            copy.execute("PRAGMA secure_delete = ON")  # the sessions' pages zeroed, not only unlinked
            copy.execute(f"DELETE FROM {Session._meta.db_table}")
            copy.execute(mark_sql())
            copy.execute(restore_point_sql().replace("%s", "?"), [at])
            copy.commit()
        finally:
            copy.close()

    def postgres(self, target: Path, fd: int, timeout: float) -> None:
        pg_dump = shutil.which("pg_dump")
        if not pg_dump:
            os.close(fd)
            raise CommandError("pg_dump is not installed (PostgreSQL's client tools, e.g. apt install "
                               "postgresql-client); see docs/operations.md#backups")
        from psycopg.conninfo import make_conninfo  # PostgreSQL's driver: only where it is the database

        params = libpq_params(connection.get_connection_params())
        # The password in the environment, not the command line (ps shows that to everyone);
        # the rest of the environment kept: libpq reads PGSSLROOTCERT, PGPASSFILE… as the product's does.
        env = {**os.environ, **({"PGPASSWORD": str(params.pop("password"))} if "password" in params else {})}
        args = [pg_dump, "-Fc", f"--exclude-table-data={Session._meta.db_table}", "-d", make_conninfo(**params)]
        try:
            with os.fdopen(fd, "wb") as out:
                done = subprocess.run(args, env=env, stdout=out, stderr=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandError(f"pg_dump did not finish within {timeout:g} s (--timeout)") from None
        if done.returncode:
            raise CommandError(f"pg_dump failed: {done.stderr.strip()[:500]}")


# What psycopg takes for itself among a connection's parameters (and the encoding pg_dump
# chooses): everything else is libpq's, and pg_dump is given it.
NOT_LIBPQ = {"cursor_factory", "context", "prepare_threshold", "row_factory", "autocommit", "client_encoding"}


def libpq_params(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key not in NOT_LIBPQ and value is not None}
