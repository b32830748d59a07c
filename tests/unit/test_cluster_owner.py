"""Who owns the cluster test's hosts (tests/cluster/hosts.py): a run that died holding them
leaves them to the next run, a live run makes the next one wait, then fail clearly.

A CI run once failed on `a cluster with prefix 'alct' is up already`: an earlier run on the
same machine had been killed mid-test, before its `down`."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.cluster import hosts

HOLD = """
import sys, time
from pathlib import Path
from tests.cluster import hosts
hosts.OWNER_LOCKS = Path(sys.argv[1])
held = hosts.owner_lock("tst")
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def locks(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "OWNER_LOCKS", tmp_path)
    return tmp_path


@pytest.fixture
def holder(locks):
    """Another process holding the prefix 'tst', as a live test run would."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(locks)], cwd=hosts.BASE_DIR,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait(10)


def test_a_live_owner_is_waited_for_then_named(holder):
    started = time.monotonic()
    with pytest.raises(hosts.ClusterError, match="stayed owned by another live run for 0.5 s"):
        hosts.owner_lock("tst", wait=0.5)
    assert time.monotonic() - started >= 0.5


def test_an_owner_killed_with_sigkill_leaves_the_prefix_free(holder):
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    lock = hosts.owner_lock("tst", wait=5)  # no `down`, no cleanup ran: the kernel freed it
    lock.close()


def test_the_owner_waiting_gets_the_prefix_when_the_first_finishes(holder):
    def finish_later():
        time.sleep(0.3)
        holder.terminate()

    threading.Thread(target=finish_later, daemon=True).start()
    lock = hosts.owner_lock("tst", wait=10)
    assert holder.wait(10) is not None
    lock.close()


def test_prefixes_are_owned_apart(holder):
    lock = hosts.owner_lock("oth", wait=0)
    lock.close()
