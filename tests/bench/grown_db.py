"""The two databases tests.bench.grown compares, made from kept copies: built once per
migrations' state (tests.bench.prefill), then copied for each run.

SQLite: the built files are kept under var/bench-cache/ and copied to
var/bench-{empty,grown}.sqlite3. PostgreSQL (the server of DATABASE_URL): each is kept as
a template database `bench_{empty,grown}_<key>` on that server and as a `pg_dump -Fc`
file under var/bench-cache/ (a new cluster restores the file instead of building
again); a run gets `CREATE DATABASE bench_{empty,grown} TEMPLATE …`, a file copy on the
server."""

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.bench import prefill
from tests.support.template_db import migrations_digest, remove_sqlite

BASE_DIR = Path(__file__).resolve().parents[2]
CACHE = BASE_DIR / "var" / "bench-cache"
NAMES = (("empty", True), ("grown", False))


def cache_key() -> str:
    """The migrations on disk (every app's, by name and text) and the prefill's own text."""
    digest = migrations_digest(hashlib.sha256())
    digest.update(Path(prefill.__file__).read_bytes())
    return digest.hexdigest()[:12]


def run_prefill(database_url, empty):
    args = [sys.executable, "-m", "tests.bench.prefill", *(["--empty"] if empty else [])]
    subprocess.run(args, cwd=BASE_DIR, env={**os.environ, "DATABASE_URL": database_url}, check=True)


def with_database(url, name):
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class Databases:
    def __init__(self, kit):
        self.url = os.environ["DATABASE_URL"]
        self.note = ""
        self.kit = kit

    def prepare(self) -> tuple[str, str]:
        """(the empty database's URL, the grown one's)."""
        CACHE.mkdir(parents=True, exist_ok=True)
        key = cache_key()
        began = time.monotonic()
        urls, how = (self._sqlite if self.url.startswith("sqlite") else self._postgres)(key)
        self.note = f"the grown database {how} in {time.monotonic() - began:.0f} s (cache key {key})"
        return urls

    def _sqlite(self, key):
        urls, how = [], "copied from var/bench-cache"
        for name, empty in NAMES:
            kept = CACHE / f"{name}-{key}.sqlite3"
            if not kept.exists():
                for old in CACHE.glob(f"{name}-*"):  # another migrations' state (a dump is PostgreSQL's)
                    if key not in old.name and old.suffix != ".pgdump":
                        old.unlink()
                building = CACHE / f"{name}-{key}.building"
                remove_sqlite(building)
                run_prefill(f"sqlite:///{building}", empty)
                with closing(sqlite3.connect(building)) as db:  # everything in the one file
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                building.rename(kept)
                remove_sqlite(building)  # its -wal, -shm and lock files
                how = "built (set-based INSERTs) and kept"
            work = BASE_DIR / "var" / f"bench-{name}.sqlite3"
            remove_sqlite(work)
            shutil.copyfile(kept, work)
            urls.append(f"sqlite:///{work}")
        return urls, how

    def _postgres(self, key):
        import psycopg

        urls, how = [], "copied from a template database"
        with psycopg.connect(with_database(self.url, "postgres"), autocommit=True) as admin:
            for name, empty in NAMES:
                template = f"bench_{name}_{key}"
                if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template]).fetchone():
                    how = self._make_template(admin, name, template, empty, key)
                work = f"bench_{name}"
                admin.execute(f'DROP DATABASE IF EXISTS "{work}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{work}" TEMPLATE "{template}"')
                urls.append(with_database(self.url, work))
        return urls, how

    def _make_template(self, admin, name, template, empty, key):
        for (old,) in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                    [f"bench\\_{name}\\_%"]).fetchall():
            admin.execute(f'DROP DATABASE "{old}" WITH (FORCE)')  # another migrations' state
        admin.execute(f'CREATE DATABASE "{template}"')
        url, dump = with_database(self.url, template), CACHE / f"{name}-{key}.pgdump"
        if dump.exists():
            subprocess.run(["pg_restore", "--no-owner", "-j", "2", "-d", url, str(dump)], check=True)
            import psycopg

            with psycopg.connect(url, autocommit=True) as db:
                db.execute("VACUUM ANALYZE")  # a restore brings no statistics
            return "restored from its pg_dump file into a template database"
        run_prefill(url, empty)
        for old in CACHE.glob(f"{name}-*.pgdump"):
            old.unlink()
        subprocess.run(["pg_dump", "-Fc", "-Z", "1", "-f", f"{dump}.part", url], check=True)
        Path(f"{dump}.part").rename(dump)
        return "built (set-based INSERTs), dumped and kept as a template database"
