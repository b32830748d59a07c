"""A throwaway redis-server for the tests that need a real Redis (Debian's `redis-server`,
apt-installed by scripts/system-deps.sh). No persistence; stopped after the test."""

import shutil
import socket
import subprocess
import time

import pytest

from tests.support.ports import free_port


def _ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_url(tmp_path):
    """`redis://127.0.0.1:PORT/0` of a redis-server started for this test."""
    binary = shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is missing: run scripts/system-deps.sh as root (apt-get install redis-server)",
                    pytrace=False)
    port = free_port()
    workdir = tmp_path / "redis"
    workdir.mkdir()
    log_path = workdir / "redis.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "no", "--dir", str(workdir)],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not _ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not answer PING on port {port}:\n{log_path.read_text(errors='replace')}",
                            pytrace=False)
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
