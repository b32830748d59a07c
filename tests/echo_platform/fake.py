"""Echo itself, as a local server: it takes replies at POST /replies and answers as the
platform documents — 200 {"id"}; 429 with Retry-After past its limit of one send a
second into one chat, or when told to (`flood_next`); 400 for a body it cannot read."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from tests.fakes.server import FakeServer, TrackedHandler

CHAT_INTERVAL = 1.0  # the documented limit the platform's pace settings stay under


class EchoServer(FakeServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: list[dict[str, Any]] = []  # accepted, in order
        self.refused: list[dict[str, Any]] = []  # answered 429
        self.flood_next = 0  # the next this many sends are answered 429
        self._ids = itertools.count(1)
        self._last_in_chat: dict[str, float] = {}

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def take(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._cond:
            chat, now = str(body.get("chat", "")), time.monotonic()
            too_soon = now - self._last_in_chat.get(chat, -CHAT_INTERVAL) < CHAT_INTERVAL * 0.9
            if self.flood_next or too_soon:
                self.flood_next = max(0, self.flood_next - 1)
                self.refused.append(body)
                return 429, {"error": "too many requests"}, {"Retry-After": "1"}
            self._last_in_chat[chat] = now
            self.replies.append(body)
            self._cond.notify_all()
            return 200, {"id": f"e{next(self._ids)}"}, {}


class _Handler(TrackedHandler):
    server: EchoServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
            status, answer, headers = self.server.take(body) if self.path == "/replies" else (404, {}, {})
        except ValueError:
            status, answer, headers = 400, {"error": "not JSON"}, {}
        data = json.dumps(answer).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
