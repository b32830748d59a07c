"""The socket platform's connection: the two steps that are a platform's own
(conversations.platforms.connection): the session, and a payload parsed."""

from __future__ import annotations

import json
from typing import Any

import websockets

from conversations.ingest import Inbound
from conversations.models import Channel
from conversations.platforms.inbound import Connection, Parsed, Receive
from delivery.models import Outcome
from delivery.transports import SendResult, Target, Transport


class SocketConnection(Connection):
    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        async with websockets.connect(channel.setting("url"), open_timeout=5) as socket:
            await socket.send(json.dumps({"resume": cursor}))
            async for frame in socket:
                event = json.loads(frame)
                await receive([event["message"]], int(event["seq"]))  # admitted and stored: then acknowledged
                await socket.send(json.dumps({"ack": event["seq"]}))

    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        if not isinstance(payload, dict) or not payload.get("id"):
            return None
        return Parsed([Inbound(platform_message_id=str(payload["id"]), chat_id=str(payload["chat"]),
                               sender_id=str(payload.get("from") or payload["chat"]), text=str(payload.get("text", "")))])


class SilentTransport(Transport):
    """Replies are not this platform's subject (its channels' agent is `pull`)."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        return SendResult(Outcome.PERMANENT, error="the socket test platform sends nothing", chat_unreachable=False)
