"""What every platform's webhook answers with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse, JsonResponse


@dataclass(frozen=True)
class Answer:
    """A webhook's answer, built before any response object (the lean ASGI path,
    conversations/lean_ingest.py, sends it without Django's request stack). `body`: JSON,
    or plain text (a str: WhatsApp's verification handshake echoes its challenge)."""

    status: int
    body: dict[str, Any] | str

    def response(self) -> HttpResponse:
        if isinstance(self.body, str):
            return HttpResponse(self.body, status=self.status, content_type="text/plain")
        return JsonResponse(self.body, status=self.status)


def error(status: int, message: str) -> Answer:
    return Answer(status, {"ok": False, "error": message})
