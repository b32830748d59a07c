"""The tests' ports (tests/support/ports.py): each process draws from a slice no other
living process holds, below the kernel's ephemeral range."""

import fcntl
import socket
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support import ports

HOLD = ("import sys; from tests.support import ports; print(ports.my_slice().start, ports.free_port(), flush=True); "
        "sys.stdin.read()")


def test_two_processes_draw_from_different_slices_below_the_ephemeral_range():
    ours = ports.my_slice()
    assert ports.free_port() in ours and ports.LAST <= 32768
    other = subprocess.Popen([sys.executable, "-c", HOLD], cwd=settings.BASE_DIR, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        start, port = map(int, other.stdout.readline().split())
        assert start != ours.start and port not in ours
    finally:
        other.kill()
        other.wait()


def test_a_slice_is_held_while_its_process_lives_and_let_go_when_it_is_killed():
    other = subprocess.Popen([sys.executable, "-c", HOLD], cwd=settings.BASE_DIR, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    start = int(other.stdout.readline().split()[0])
    with open(ports.LOCKS / f"{start}.lock", "wb") as lock:
        with pytest.raises(BlockingIOError):  # held by the living process
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other.kill()  # SIGKILL: no exit handler runs; the kernel lets the lock go
        other.wait()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lock, fcntl.LOCK_UN)


def test_a_port_something_listens_on_is_never_handed_out():
    taken = ports.free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        assert taken not in {ports.free_port() for _ in range(ports.SLICE - 1)}
