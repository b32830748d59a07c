"""Quiet when nothing happens: the product under `make run`'s defaults (manage.py runall,
SQLite, DEBUG off), idle through a round of django-q2's scheduled sweeps, logs no
routine INFO lines — routine work logs only when it found something to do."""

import os
import re
import sqlite3
import subprocess
import sys

from tests.conftest import BASE_DIR, free_port, run_python, wait_until
from tests.support import local_http

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$")
SCHEDULED_SWEEPS = 4  # recovery, ledger safety sweep, ledger prune, guard sweep (migrations create them)


def sweeps_done(db):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM django_q_task WHERE success").fetchone()[0] >= SCHEDULED_SWEEPS


def test_idle_product_runs_its_sweeps_without_a_log_line(tmp_path):
    db = tmp_path / "idle.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "LOG_LEVEL", "DJANGO_Q_LOG_LEVEL")}
    env.update({"DATABASE_URL": f"sqlite:///{db}", "DJANGO_SETTINGS_MODULE": "agentloop.settings",
                "PYTHONUNBUFFERED": "1"})
    run_python([sys.executable, "manage.py", "migrate", "-v0"], env=env, check=True, timeout=300)
    port = free_port()
    log_path = tmp_path / "runall.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "manage.py", "runall", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "agentloop is running" in log_path.read_text() and " started" in log_path.read_text(),
                       timeout=60, message="runall up, worker started")
            not_found = local_http.get(f"http://127.0.0.1:{port}/no-such-page", timeout=10)
            assert not_found.status_code == 404 and "URLconf" not in not_found.text  # not a debug page
            wait_until(lambda: "Not Found: /no-such-page" in log_path.read_text(), message="the 404 logged")
            started = len(log_path.read_text())
            # django-q2 creates the scheduled tasks on its first scheduler round (~30 s in).
            wait_until(lambda: sweeps_done(db), timeout=90, interval=0.5, message="the scheduled sweeps to run")
            idle = log_path.read_text()[started:]
        finally:
            proc.terminate()
            proc.wait(60)
    lines = [m.groups() for m in map(LOG_LINE.match, idle.splitlines()) if m]
    assert lines == [], "logged while idle:\n" + idle
