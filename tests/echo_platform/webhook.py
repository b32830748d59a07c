"""Echo's webhook: the three steps that are a platform's own (conversations.platforms.inbound)."""

from __future__ import annotations

import json

from conversations.ingest import Admission, Inbound
from conversations.models import Channel
from conversations.platforms.inbound import Parsed, Received, Request, Webhook, shared_secret
from conversations.platforms.webhooks import Answer, error

SECRET_HEADER = "X-Echo-Secret"


class EchoWebhook(Webhook):
    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        return shared_secret(request, SECRET_HEADER, channel.setting("secret"), "--secret", "secret")

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            data = json.loads(request.body or b"")
            inbound = Inbound(platform_message_id=str(data["id"]), chat_id=str(data["chat"]),
                              sender_id=str(data.get("from") or data["chat"]), text=str(data.get("text", "")))
        except (ValueError, TypeError, KeyError) as exc:
            return error(400, f"not an echo message: {exc!r}")
        return Parsed([inbound])

    def answer(self, received: Received, results: list[object]) -> Answer:
        admitted = [result for result in results if isinstance(result, Admission)]
        return Answer(200, {"ok": True, "duplicate": bool(admitted) and all(a.duplicate for a in admitted),
                            "refused": len(results) - len(admitted)})
