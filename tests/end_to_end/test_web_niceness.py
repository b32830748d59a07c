"""`make run`'s web process yields the cores to the worker when both want them (issue 57):
manage.py runall starts it at niceness WEB_NICENESS, every thread of it (a thread takes
its creator's niceness, so the server sets it before any thread starts), and
`runall --web-nice 0` starts it at the worker's."""

import os
from pathlib import Path

import pytest

from conversations.management.commands import runall
from tests.conftest import WebProcess, free_port, wait_until
from tests.support import local_http

pytestmark = pytest.mark.e2e


def niceness_of_threads(pid) -> set[int]:
    """The niceness of each thread of `pid` (/proc/<pid>/task/<tid>/stat, field 19)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended since the listing (a pool's, done)
            continue
        found.add(int(stat[stat.rindex(")") + 2:].split()[16]))
    return found


def started(processes, web_nice):
    port = free_port()
    args = runall.processes("127.0.0.1", port, web_nice)["web"]
    web = processes.start("web", args, kind=WebProcess)
    web.base_url = f"http://127.0.0.1:{port}"
    assert local_http.get(f"{web.url}/healthz").status_code == 200  # serving: its threads have started
    return web


def test_runall_starts_the_web_process_nicer_than_the_worker_every_thread_of_it(processes):
    assert runall.WEB_NICENESS > 0
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    web = started(processes, runall.WEB_NICENESS)
    threads = wait_until(lambda: niceness_of_threads(web.pid), timeout=5, message="the web process's threads")
    assert threads == {ours + runall.WEB_NICENESS}, threads
    assert runall.processes("127.0.0.1", 1)["web"][-2:] == ["--nice", str(runall.WEB_NICENESS)]  # the default


def test_web_nice_zero_leaves_it_at_the_workers_niceness(processes):
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    web = started(processes, 0)
    assert "--nice" not in runall.processes("127.0.0.1", 1, 0)["web"]
    assert niceness_of_threads(web.pid) == {ours}
