"""The lock that keeps Chromium and a change of the host's network apart (tests/support/host_network.py)."""

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.support import host_network


@pytest.fixture(autouse=True)
def locks_of_this_test(tmp_path, monkeypatch):
    monkeypatch.setattr(host_network, "VAR", tmp_path)
    monkeypatch.setattr(host_network, "LOCK", tmp_path / "host-network.lock")
    monkeypatch.setattr(host_network, "TURNSTILE", tmp_path / "host-network.turnstile")


def in_thread(context, events, name, release=None):
    """Enter `context` in a thread, note when it is in, then leave once `release` is set."""
    entered = threading.Event()

    def hold():
        with context():
            events.append(name)
            entered.set()
            if release is not None:
                release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread, entered


def test_browsers_share_and_a_change_waits_for_them():
    events, release = [], threading.Event()
    first, first_in = in_thread(host_network.browsing, events, "browser 1", release)
    second, second_in = in_thread(host_network.browsing, events, "browser 2", release)
    assert first_in.wait(5) and second_in.wait(5), "two browsers live at once"
    change, change_in = in_thread(host_network.changing, events, "change")
    assert not change_in.wait(0.3), "the network changed under a live browser"
    release.set()
    assert change_in.wait(5)
    for thread in (first, second, change):
        thread.join(5)
    assert events[-1] == "change"


def test_a_waiting_change_goes_before_a_browser_that_comes_after_it():
    events, release_first, release_change = [], threading.Event(), threading.Event()
    first, first_in = in_thread(host_network.browsing, events, "browser 1", release_first)
    assert first_in.wait(5)
    change, change_in = in_thread(host_network.changing, events, "change", release_change)
    wait_until(host_network.change_waiting, timeout=5, message="the change waiting at the turnstile")
    later, later_in = in_thread(host_network.browsing, events, "browser 2")
    assert not later_in.wait(0.3), "a later browser overtook the waiting change"
    release_first.set()
    assert change_in.wait(5)
    assert not later_in.wait(0.2), "a browser started while the network changed"
    release_change.set()
    assert later_in.wait(5)
    for thread in (first, change, later):
        thread.join(5)
    assert events == ["browser 1", "change", "browser 2"]


def test_a_lock_held_too_long_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(host_network, "WAIT_SECONDS", 0.2)
    release = threading.Event()
    holder, held = in_thread(host_network.changing, [], "change", release)
    assert held.wait(5)
    with pytest.raises(TimeoutError, match="held for more than"):
        with host_network.browsing():
            pass
    release.set()
    holder.join(5)


# scripts/network-lock.sh: cluster.sh's side of the same lock, in the shell.
NETWORK_LOCK = Path(__file__).resolve().parents[2] / "scripts" / "network-lock.sh"


def shell_change(script, **env):
    """`script` run by bash with network_change defined and the test's lock folder named."""
    return subprocess.Popen(["bash", "-euo", "pipefail", "-c", f". {NETWORK_LOCK}; {script}"],
                            env={**os.environ, "CLUSTER_NETWORK_LOCKS": str(host_network.VAR), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_scripts_change_waits_for_a_live_browser_and_holds_the_lock_only_while_it_runs(tmp_path):
    marker = tmp_path / "changed"
    release = threading.Event()
    browser, browser_in = in_thread(host_network.browsing, [], "browser", release)
    assert browser_in.wait(5)
    # The change, then a process started after it that outlives the script: it must not
    # have inherited the lock.
    change = shell_change(f"network_change touch {marker}; (sleep 5 &)")
    time.sleep(0.5)
    assert not marker.exists(), "the network changed under a live browser"
    release.set()
    assert change.wait(10) == 0, change.stderr.read()
    assert marker.exists()
    later, later_in = in_thread(host_network.browsing, [], "browser 2")
    assert later_in.wait(5), "the lock stayed held after the change (inherited by a process it started?)"
    for thread in (browser, later):
        thread.join(5)


def test_a_failing_change_exits_the_script_and_a_lock_held_too_long_is_a_clear_error():
    failed = shell_change("network_change false; echo went on")
    assert failed.wait(10) != 0 and "went on" not in failed.stdout.read()
    later, later_in = in_thread(host_network.browsing, [], "browser")
    assert later_in.wait(5), "a failed change left the lock held"
    later.join(5)
    release = threading.Event()
    browser, browser_in = in_thread(host_network.browsing, [], "browser", release)
    assert browser_in.wait(5)
    try:
        refused = shell_change("network_change true", CLUSTER_NETWORK_WAIT="1")
        assert refused.wait(10) == 1
        assert "not free within 1 s" in refused.stderr.read()
    finally:
        release.set()
        browser.join(5)


def test_a_long_browser_lets_a_waiting_change_go_between_two_pages_and_holds_again():
    """What the operator pages test does between two pages (tests/support/browser.py
    let_network_changes_through): a waiting change goes, and the browser holds again after it."""
    events, release_change = [], threading.Event()
    with host_network.browsing() as hold:
        assert not host_network.change_waiting()
        change, change_in = in_thread(host_network.changing, events, "change", release_change)
        wait_until(host_network.change_waiting, timeout=5, message="the change waiting at the turnstile")
        assert not change_in.wait(0.3), "the network changed under a live browser"
        letting = threading.Thread(target=hold.let_changes_through, daemon=True)
        letting.start()
        assert change_in.wait(5), "the waiting change did not go"
        letting.join(0.3)
        assert letting.is_alive(), "the browser held again while the network changed"
        release_change.set()
        letting.join(5)
        change.join(5)
        assert not host_network.change_waiting()
        second, second_in = in_thread(host_network.changing, events, "second change")
        assert not second_in.wait(0.3), "the browser does not hold again"
    assert second_in.wait(5)
    second.join(5)
    assert events == ["change", "second change"]
