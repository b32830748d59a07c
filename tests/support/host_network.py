"""Chromium and the cluster's network, kept apart across the two passes.

Chromium aborts every request in flight with net::ERR_NETWORK_CHANGED when an address of
the machine's (root) network namespace appears or goes, and there is no switch to make it
look away (https://issues.chromium.org/issues/41465264). The cluster test's `up` and `down`
(scripts/cluster.sh) add and remove the bridge's address in that namespace, and in the
"alone" phase one pass's browser tests run while the other pass runs the cluster test: a
page there once lost a script to it. So a browser holds this lock shared while it lives,
and changing the host's network takes it exclusively; a second lock file lets a waiting
change go before browsers that come after it (flock itself prefers neither), and a long
browser test lets a waiting change go between two of its pages (Browsing.let_changes_through).
scripts/cluster.sh takes it itself (scripts/network-lock.sh), around the few `ip`
commands that change the root namespace, not while the hosts start or stop.
"""

import contextlib
import fcntl
import time
from pathlib import Path

VAR = Path(__file__).resolve().parents[2] / "var"
LOCK = VAR / "host-network.lock"
TURNSTILE = VAR / "host-network.turnstile"
# The longest a browser test or a cluster's `up`/`down` holds the lock, with room to spare.
WAIT_SECONDS = 300


def change_waiting() -> bool:
    """A change of the network waits for the browsers alive (it holds the turnstile)."""
    with open(TURNSTILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


class Browsing:
    """The shared hold of a live browser (browsing() yields it)."""

    def __init__(self):
        with _locked(TURNSTILE, fcntl.LOCK_EX):
            self.held = open_locked(LOCK, fcntl.LOCK_SH)

    def let_changes_through(self):
        """Let a waiting change go, then hold again: for a browser with nothing in flight
        (a long test between two pages), so that a change waits for one page, not the whole
        test (the operator pages test held the failover test's start back for 28 s)."""
        self.held.close()
        with _locked(TURNSTILE, fcntl.LOCK_EX):  # after the change that held it
            self.held = open_locked(LOCK, fcntl.LOCK_SH)

    def close(self):
        self.held.close()


@contextlib.contextmanager
def browsing():
    """Held while a browser lives: no change to the host's network meanwhile."""
    hold = Browsing()
    try:
        yield hold
    finally:
        hold.close()


@contextlib.contextmanager
def changing():
    """Held while the host's network changes: no browser lives meanwhile."""
    with _locked(TURNSTILE, fcntl.LOCK_EX), _locked(LOCK, fcntl.LOCK_EX):
        yield


@contextlib.contextmanager
def _locked(path, mode):
    handle = open_locked(path, mode)
    try:
        yield
    finally:
        handle.close()


def open_locked(path, mode, wait=None, poll=0.05):
    """`path` opened and flock'ed in `mode` (close it to release), waiting at most `wait`
    seconds, WAIT_SECONDS by default (then TimeoutError). Also the cluster's owner lock
    (tests/cluster/hosts.py)."""
    wait = WAIT_SECONDS if wait is None else wait
    Path(path).parent.mkdir(exist_ok=True)
    handle = open(path, "a")
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise TimeoutError(f"{path} was held for more than {wait} s") from None
            time.sleep(poll)
