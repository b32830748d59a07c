"""`manage.py backup PATH`: a consistent copy of the database while the product runs.

SQLite: the online backup API (sqlite3.Connection.backup), page by page, consistent at
its end. PostgreSQL: `pg_dump -Fc` (a custom-format archive for `pg_restore`).

A reply the ledger holds open in the copy may be sent after the copy was taken: in the
SQLite copy each open row is marked as "its send may have started" (the ledger's own
rule), so a product restored from it resends it labelled, never silently twice. For
PostgreSQL, `manage.py backup --mark-restored` runs that step on the restored database.
"""

import shutil
import sqlite3
import subprocess
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from delivery.models import OutboundMessage, OutboundState

OPEN = (OutboundState.PENDING, OutboundState.FAILED, OutboundState.ATTEMPTING)


def mark_sql():
    table = OutboundMessage._meta.db_table
    states = ", ".join(f"'{s}'" for s in OPEN)
    return f"UPDATE {table} SET chunks_started = chunks_delivered + 1 WHERE state IN ({states})"


class Command(BaseCommand):
    help = "Back the database up to PATH while the product runs (docs/operations.md#backups)."

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", default="")
        parser.add_argument("--mark-restored", action="store_true",
                            help="On a database just restored: label the resend of every open reply.")

    def handle(self, *args, path, mark_restored, **options):
        if mark_restored:
            with connection.cursor() as cursor:
                cursor.execute(mark_sql())
                self.stdout.write(f"{cursor.rowcount} open ledger rows will be resent labelled")
            return
        if not path:
            raise CommandError("give the backup's PATH")
        target = Path(path)
        if target.exists():
            raise CommandError(f"{target} exists: choose a new path")
        if connection.vendor == "sqlite":
            self.sqlite(target)
        else:
            self.postgres(target)
        self.stdout.write(f"backed up to {target}")

    def sqlite(self, target):
        connection.ensure_connection()
        source = connection.connection
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)  # one step: a read snapshot (WAL: writers go on meanwhile)
            copy.execute(mark_sql())
            copy.commit()
        finally:
            copy.close()

    def postgres(self, target):
        pg_dump = shutil.which("pg_dump")
        if not pg_dump:
            raise CommandError("pg_dump is not installed (PostgreSQL's client tools, e.g. apt install "
                               "postgresql-client); see docs/operations.md#backups")
        s = connection.settings_dict
        env = {"PGPASSWORD": s["PASSWORD"] or "", "PATH": "/usr/bin:/bin"}
        args = [pg_dump, "-Fc", "-f", str(target), "-h", s["HOST"] or "localhost", "-p", str(s["PORT"] or 5432),
                "-U", s["USER"], s["NAME"]]
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        if done.returncode:
            raise CommandError(f"pg_dump failed: {done.stderr.strip()[:500]}")
