"""What every platform's webhook answers with."""

from dataclasses import dataclass

from django.http import JsonResponse


@dataclass(frozen=True)
class Answer:
    """A webhook's answer, built before any response object (the lean ASGI path,
    conversations/lean_ingest.py, sends it without Django's request stack)."""

    status: int
    body: dict

    def response(self):
        return JsonResponse(self.body, status=self.status)


def error(status, message) -> Answer:
    return Answer(status, {"ok": False, "error": message})
