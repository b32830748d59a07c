"""A real Radicale CalDAV server in a subprocess, for tests of the CalDAV backend.

Not a fake: the real server (from the venv), with its storage in a temporary folder
and htpasswd authentication (plain passwords) so the client's auth path is exercised::

    with RadicaleServer(tmp_dir) as server:
        client = caldav.DAVClient(url=server.url, username=server.username, password=server.password)

``stop()`` terminates it (SIGTERM, then SIGKILL); ``start()`` runs it again on the same
port and storage, so a test can take the server down and bring it back.
``SwallowingProxy`` sits in front of it and loses the answers to writes.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from tests.support.ports import free_port


class RadicaleServer:
    def __init__(self, directory, username="agentloop", password="s3cret-pass", port=None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.username = username
        self.password = password
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = self.directory / "radicale.log"
        self.popen: subprocess.Popen | None = None
        self._log = None
        self._write_config()

    def _write_config(self):
        htpasswd = self.directory / "users"
        htpasswd.write_text(f"{self.username}:{self.password}\n")
        self.config_path = self.directory / "radicale.conf"
        self.config_path.write_text(
            f"[server]\nhosts = 127.0.0.1:{self.port}\n"
            f"[auth]\ntype = htpasswd\nhtpasswd_filename = {htpasswd}\nhtpasswd_encryption = plain\ndelay = 0\n"
            "[rights]\ntype = owner_only\n"
            f"[storage]\nfilesystem_folder = {self.directory / 'collections'}\n"
            "[web]\ntype = none\n"
            "[logging]\nlevel = warning\n"
        )

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, timeout=20.0) -> Self:
        if self.running:
            return self
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes to it until stop()
        self.popen = subprocess.Popen([sys.executable, "-m", "radicale", "--config", str(self.config_path)],
                                      stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.popen.poll() is not None:
                raise RuntimeError(f"radicale exited with {self.popen.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"radicale did not answer on {self.url} within {timeout}s:\n{self.output()}")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        """Any HTTP answer counts (401 without credentials is the expected one)."""
        try:
            urllib.request.urlopen(self.url, timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def stop(self, timeout=10.0):
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class SwallowingProxy:
    """A TCP proxy in front of a server that loses the answers to writes.

    Everything is forwarded both ways, except that once a request whose method is in
    `swallow` has gone through a connection, the server's answers on that connection are
    dropped: the request reached the server (and took effect there) but the client never
    hears back — the "connection dropped while the PUT was in flight" case. With
    `hang_up` the connection is closed as soon as the request is through, instead of
    being left silent (the client then sees a dropped connection rather than a timeout).
    """

    def __init__(self, target_port, swallow=("PUT",), hang_up=False):
        self.target_port = target_port
        self.hang_up = hang_up
        self.swallow = tuple(f"{method} ".encode() for method in swallow)
        self.swallowed = 0
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            state = {"swallowing": False}
            threading.Thread(target=self._pump, args=(client, upstream, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, state, False), daemon=True).start()

    def _pump(self, source, target, state, from_client):
        try:
            while data := source.recv(65536):
                if from_client and data.startswith(self.swallow):
                    state["swallowing"] = True
                    with self._lock:
                        self.swallowed += 1
                if not from_client and state["swallowing"]:
                    continue
                target.sendall(data)
                if from_client and state["swallowing"] and self.hang_up:
                    source.settimeout(0.3)  # the rest of the request (its body), then hang up
        except TimeoutError:
            time.sleep(0.2)  # let the server take it in before the line goes dead
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self):
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc):
        self.close()
