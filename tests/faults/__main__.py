"""`python -m tests.faults`: the crash matrix — every fault point × SQLite and PostgreSQL
→ lost messages / unlabelled duplicate replies / labelled resends / recovery notices /
calendar events — printed as a table; the exit status is 1 if any cell breaks a promise.

    .venv/bin/python -m tests.faults [--database sqlite|postgresql|both] [--point NAME ...]
    .venv/bin/python -m tests.faults outage [...]      the database-outage suite

SQLite runs in a fresh file under /tmp. PostgreSQL runs on DATABASE_URL when it is set
(that database is created if missing and FLUSHED — give it a scratch one), otherwise on
a throwaway cluster (scripts/pg.sh, in a folder under /tmp the `postgres` user owns).
Each database is run by a child process of its own (Django is set up once per process).
"""

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
RESULTS = "crash-matrix-results: "


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "outage":
        if importlib.util.find_spec("tests.faults.outage") is None:
            print("tests/faults/outage.py is not there", file=sys.stderr)
            return 2
        return importlib.import_module("tests.faults.outage").main(argv[1:])
    if argv and argv[0] == "_one":
        return one_database(argv[1:])
    from audit.failpoints import POINTS

    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--point", action="append", choices=POINTS, help="only these points (repeatable)")
    args = parser.parse_args(argv)
    points = args.point or list(POINTS)
    databases = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    rows, failed = [], False
    for database in databases:
        with database_url(database) as url:
            found, ok = run_child(database, url, points)
        rows += found
        failed |= not ok
    from tests.faults.matrix import table

    print()
    print(table([tuple(r) for r in rows]))
    return 1 if failed else 0


@contextlib.contextmanager
def database_url(database):
    if database == "sqlite":
        with tempfile.TemporaryDirectory(prefix="agentloop-faults-") as folder:
            yield f"sqlite:///{folder}/faults.sqlite3"
        return
    given = os.environ.get("DATABASE_URL", "")
    if given.startswith("postgres"):
        create_database(given)
        yield given
        return
    folder = tempfile.mkdtemp(prefix="agentloop-faults-pg-")
    pg = str(BASE_DIR / "scripts" / "pg.sh")
    started = subprocess.run([pg, "start", folder], capture_output=True, text=True)
    try:
        if started.returncode != 0:
            raise SystemExit(f"could not start PostgreSQL in {folder}: {started.stderr}")
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([pg, "stop", folder], capture_output=True)


def create_database(url):
    """The scratch database named by DATABASE_URL, created on its server if missing."""
    from urllib.parse import urlsplit

    import psycopg

    name = urlsplit(url).path.lstrip("/")
    server = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def run_child(database, url, points):
    """The matrix on one database, in a child process; its rows as it prints them."""
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    env.pop("AGENTLOOP_FAILPOINT", None)
    child = subprocess.Popen([sys.executable, "-m", "tests.faults", "_one", "--database", database, *points],
                             cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, text=True)
    rows = []
    for line in child.stdout:
        if line.startswith(RESULTS):
            rows = json.loads(line[len(RESULTS):])
        else:
            print(line, end="", flush=True)
    code = child.wait()
    if not rows:
        print(f"the {database} run produced no results (exit {code})", file=sys.stderr)
    return rows, code == 0 and bool(rows)


def one_database(argv):
    """The child: set Django up on DATABASE_URL, empty it, run the points."""
    database, points = argv[1], argv[2:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    from tests.conftest import Processes, stop_zygote
    from tests.fakes.telegram_api import FakeBotAPI
    from tests.faults.matrix import row, run_all

    logs = Path(tempfile.mkdtemp(prefix=f"agentloop-faults-{database}-logs-"))
    print(f"[{database}] process logs in {logs}", flush=True)
    processes = Processes(logs, metrics_dir=logs / "metrics")
    with FakeBotAPI() as fake:
        try:
            results = run_all(processes, fake, database, points,
                              report=lambda r: print(f"[{database}] " + "  ".join(r), flush=True))
        finally:
            processes.stop_all()
            stop_zygote()
    print(RESULTS + json.dumps([row(r) for r in results]), flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
