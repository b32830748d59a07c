"""What every fake server here shares: an in-process ThreadingHTTPServer on 127.0.0.1
with one lock (a condition that wakes holds, delays and wait_for), keep-alive handlers
that are tracked so stop() can cut idle connections, and a stop() that releases every
held request first."""

from __future__ import annotations

import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must never keep the test process alive
    allow_reuse_address = True

    def __init__(self, address, handler):
        super().__init__(address, handler)
        # One lock for all state; its condition wakes long polls, wait_for and holds.
        self._cond = threading.Condition(threading.RLock())
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._holds: list = []  # each with a `released` flag

    def start(self):
        # A short poll interval keeps stop() fast (shutdown waits for one poll).
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{type(self).__name__}:{self.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: held and delayed requests are dropped unanswered."""
        if self._stopping.is_set():
            return
        with self._cond:
            self._stopping.set()  # cuts delays short
            for hold in self._holds:
                hold.released = True
            self._cond.notify_all()
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self._close_connections()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (timeouts, dropped connections, stop()) are normal here.
        if self._stopping.is_set() or isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def __enter__(self):
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _track(self, connection: socket.socket) -> None:
        with self._cond:
            self._connections.add(connection)

    def _untrack(self, connection: socket.socket) -> None:
        with self._cond:
            self._connections.discard(connection)

    def _close_connections(self) -> None:
        # Idle keep-alive connections would otherwise leave handler threads
        # blocked reading the next request after stop().
        with self._cond:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TrackedHandler(BaseHTTPRequestHandler):
    """A keep-alive handler its server can cut at stop()."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real APIs; clients pool connections
    # Headers and body go out in two writes; with Nagle on, the body waits for
    # the client's delayed ACK and every answer takes ~40 ms.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.server._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output readable; the server's recorded calls are the log
