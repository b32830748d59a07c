"""Chromium and the cluster's network, kept apart across the two passes.

Chromium aborts every request in flight with net::ERR_NETWORK_CHANGED when an address of
the machine's (root) network namespace appears or goes, and there is no switch to make it
look away (https://issues.chromium.org/issues/41465264). The cluster test's `up` and `down`
(scripts/cluster.sh) add and remove the bridge's address in that namespace, and in the
"alone" phase one pass's browser tests run while the other pass runs the cluster test: a
page there once lost a script to it. So a browser holds this lock shared while it lives,
and changing the host's network takes it exclusively; a second lock file lets a waiting
change go before browsers that come after it (flock itself prefers neither).
"""

import contextlib
import fcntl
import time
from pathlib import Path

VAR = Path(__file__).resolve().parent.parent / "var"
LOCK = VAR / "host-network.lock"
TURNSTILE = VAR / "host-network.turnstile"
# The longest a browser test or a cluster's `up`/`down` holds the lock, with room to spare.
WAIT_SECONDS = 300


@contextlib.contextmanager
def browsing():
    """Held while a browser lives: no change to the host's network meanwhile."""
    with _locked(TURNSTILE, fcntl.LOCK_EX):
        held = _open_locked(LOCK, fcntl.LOCK_SH)
    try:
        yield
    finally:
        held.close()


@contextlib.contextmanager
def changing():
    """Held while the host's network changes: no browser lives meanwhile."""
    with _locked(TURNSTILE, fcntl.LOCK_EX), _locked(LOCK, fcntl.LOCK_EX):
        yield


@contextlib.contextmanager
def _locked(path, mode):
    handle = _open_locked(path, mode)
    try:
        yield
    finally:
        handle.close()


def _open_locked(path, mode):
    """`path` opened and flock'ed in `mode`, waiting at most WAIT_SECONDS (then TimeoutError)."""
    VAR.mkdir(exist_ok=True)
    handle = open(path, "a")
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise TimeoutError(f"{path} was held for more than {WAIT_SECONDS} s") from None
            time.sleep(0.05)
