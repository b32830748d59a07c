"""The metrics directory (agentloop.core.metrics_dir): which processes take part, and the
library's cleaning done at start — a new start wipes the last run's files, a start beside
a living process keeps its counters and removes only dead processes' live gauges."""

import os
import subprocess
import sys

from prometheus_client import REGISTRY

from agentloop.core import metrics, metrics_dir
from agentloop.core.backoff import DatabaseFaultLog


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_the_products_processes_take_part():
    assert metrics_dir.process_kind(["/srv/agentloop/agentloop/web_server.py", "--port", "8000"]) == "web"
    assert metrics_dir.process_kind(["/venv/bin/uvicorn", "agentloop.asgi:application"]) == "web"
    assert metrics_dir.process_kind(["/venv/lib/python3.11/site-packages/uvicorn/__main__.py", "app"]) == "web"
    assert metrics_dir.process_kind(["manage.py", "runloop"]) == "worker"
    assert metrics_dir.process_kind(["manage.py", "qcluster"]) == "tasks"
    assert metrics_dir.process_kind(["manage.py", "migrate"]) == ""
    assert metrics_dir.process_kind(["/usr/bin/pytest", "tests"]) == ""
    assert metrics_dir.process_kind([]) == ""


def test_a_start_with_nobody_alive_wipes_the_last_run(tmp_path):
    old = dead_pid()
    for name in (f"counter_{old}.db", f"histogram_{old}.db", f"gauge_livemax_{old}.db", f"{old}.pid"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not ours")
    assert metrics_dir.prepare(tmp_path, pid=os.getpid()) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", f"{os.getpid()}.pid", "notes.txt"]


def test_a_start_beside_a_living_process_keeps_the_counters(tmp_path):
    old, alive = dead_pid(), os.getppid()
    for name in (f"counter_{old}.db", f"gauge_livemax_{old}.db", f"{old}.pid", f"{alive}.pid",
                 f"counter_{alive}.db"):
        (tmp_path / name).write_bytes(b"x")
    assert metrics_dir.prepare(tmp_path, pid=os.getpid()) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", f"{os.getpid()}.pid", f"{alive}.pid", f"counter_{old}.db", f"counter_{alive}.db"])


def test_a_scrape_forgets_the_live_gauges_of_the_dead(tmp_path):
    old, alive = dead_pid(), os.getpid()
    for name in (f"gauge_livemax_{old}.db", f"gauge_livemax_{alive}.db", f"counter_{old}.db"):
        (tmp_path / name).write_bytes(b"x")
    metrics_dir.forget_the_dead(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"gauge_livemax_{alive}.db", f"counter_{old}.db"])


def test_a_database_fault_is_counted_once_with_its_seconds():
    clock = iter([100.0, 101.0, 102.5]).__next__
    faults = DatabaseFaultLog(every=30.0, clock=clock)
    before = REGISTRY.get_sample_value("agentloop_database_faults_total")
    seconds = REGISTRY.get_sample_value("agentloop_database_fault_seconds_total")
    faults.failed(OSError("connection refused"))
    faults.failed(OSError("connection refused"))
    assert metrics.DATABASE_FAILING._value.get() == 1
    faults.recovered()
    assert REGISTRY.get_sample_value("agentloop_database_faults_total") == before + 1
    assert REGISTRY.get_sample_value("agentloop_database_fault_seconds_total") == seconds + 2.5
    assert metrics.DATABASE_FAILING._value.get() == 0
