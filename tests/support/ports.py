"""Ports for the servers the tests start (web servers, moto, Synapse, Redis, Radicale…).

Not the kernel's pick (bind to port 0, read it, close, hand it on): that port is free
only until someone else takes it, and the kernel hands the same range out to every
outgoing connection on the machine (ip_local_port_range, 32768-60999 here). With a dozen
pytest processes each starting servers and opening connections, a web server once failed
to bind the port it had just been told was free ([Errno 98], 2 of 4 full runs had one).

So each process takes ports from a slice of its own below that range: no connection's
local port lands there, and no other process allocates there. The slice is claimed by
locking its file (flock, held while the process lives, let go when it dies however it
dies), not chosen from the pass and the xdist worker's name: the backfill's unit tests
and the alone phase are two pytest processes of the same pass and no worker, and their
equal slices once handed both the same port. A port still in use (a server an earlier
test left running) is skipped.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import IO

FIRST, LAST = 20_000, 32_000  # below the kernel's ephemeral range
SLICE = 400  # ports per process: 30 slices
LOCKS = Path(tempfile.gettempdir()) / "agentloop-test-ports"

_lock = threading.Lock()
# This process's claim: (its pid, the open lock file, the slice, the next ports). A forked
# child sees its parent's pid here and claims a slice of its own.
_claimed: tuple[int, IO[bytes], range, itertools.cycle[int]] | None = None


def _claim() -> tuple[IO[bytes], range]:
    """The first slice whose lock file no other living process holds, and that file."""
    LOCKS.mkdir(exist_ok=True)
    for start in range(FIRST, LAST - SLICE + 1, SLICE):
        handle = open(LOCKS / f"{start}.lock", "wb")  # noqa: SIM115 -- held as long as the process lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return handle, range(start, start + SLICE)
    raise RuntimeError(f"every slice of ports {FIRST}-{LAST} is held by another process (see {LOCKS})")


def my_slice() -> range:
    """This process's slice, claimed on first use."""
    global _claimed
    with _lock:
        if _claimed is None or _claimed[0] != os.getpid():
            handle, ports = _claim()
            _claimed = (os.getpid(), handle, ports, itertools.cycle(ports))
        return _claimed[2]


def free_port() -> int:
    """A port of this process's slice that nothing listens on now."""
    ports = my_slice()
    with _lock:
        assert _claimed is not None
        for _ in range(len(ports)):
            port = next(_claimed[3])
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {ports}")
