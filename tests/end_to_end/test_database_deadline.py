"""A PostgreSQL host that accepts a connection and then never answers (a half-dead
host, a black-holing firewall) must not hang a process's (re)connect forever: the
settings give every connect a deadline, and the worker's back-off takes it from there."""

import socket
import subprocess
import sys
import time

from tests.conftest import BASE_DIR

CONNECT = """
import django, time
django.setup()
from django.db import connection, OperationalError
started = time.monotonic()
try:
    connection.ensure_connection()
except OperationalError as exc:
    print("refused after %.1f" % (time.monotonic() - started))
"""


def test_a_connect_to_a_silent_database_host_fails_within_its_deadline():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshake; nobody ever speaks
    port = silent.getsockname()[1]
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "agentloop.settings",
           "DATABASE_URL": f"postgres://agentloop@127.0.0.1:{port}/agentloop", "DATABASE_CONNECT_TIMEOUT": "2"}
    started = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", CONNECT], cwd=BASE_DIR, env=env, capture_output=True,
                             text=True, timeout=60)
    finally:
        silent.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused after"), out.stdout + out.stderr
    assert float(out.stdout.split()[-1]) < 5.0
    assert time.monotonic() - started < 30
