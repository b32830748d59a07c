"""Ports for the servers the tests start (web servers, moto, Synapse, Redis, Radicale…).

Not the kernel's pick (bind to port 0, read it, close, hand it on): that port is free
only until someone else takes it, and the kernel hands the same range out to every
outgoing connection on the machine (ip_local_port_range, 32768-60999 here). With six
pytest processes each starting servers and opening connections, a web server once failed
to bind the port it had just been told was free ([Errno 98], 2 of 4 full runs had one).

So each pytest process takes ports from a slice of its own below that range: no
connection's local port lands there, and no other test process allocates there. A port
still in use (a server left running by an earlier test) is skipped.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

FIRST, LAST = 20_000, 32_000  # below the kernel's ephemeral range
_PASSES = {"sqlite": 1, "postgres": 2}  # scripts/test.sh's two passes; 0: a plain pytest
_WORKERS = 8  # xdist workers per pass (gw0-gw7); the controller (no workers) takes slot 0


def _slice() -> range:
    pass_index = _PASSES.get(os.environ.get("AGENTLOOP_TEST_PASS", ""), 0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    worker_index = int(worker[2:]) + 1 if worker.startswith("gw") else 0
    slot = pass_index * (_WORKERS + 1) + min(worker_index, _WORKERS)
    size = (LAST - FIRST) // (len(_PASSES) + 1) // (_WORKERS + 1)
    return range(FIRST + slot * size, FIRST + (slot + 1) * size)


_lock = threading.Lock()
_next = itertools.cycle(_slice())


def free_port() -> int:
    """A port of this process's slice that nothing listens on now."""
    with _lock:
        for _ in range(len(_slice())):
            port = next(_next)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {_slice()}")
