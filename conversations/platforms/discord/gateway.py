"""Discord's Gateway, held open per channel by the worker (conversations.platforms.
connection: one holder per bot across workers and hosts, under the channel's lease).

The session, as Discord documents it: connect (the URL `GET /gateway/bot` gives, or the
`resume_gateway_url` READY gave) → Hello (op 10) with the heartbeat interval → IDENTIFY
(op 2), or RESUME (op 6: the session id and the last sequence number stored) → dispatches
(op 0), each with its sequence number `s`, until the socket drops. Heartbeats (op 1, the
last sequence number) go out every interval, the first after a random part of it; one
left unacknowledged (no op 11 since the last) means a dead connection: it is closed and
resumed. RECONNECT (op 7) and INVALID_SESSION (op 9, d: true) → resume; INVALID_SESSION
(d: false) or close codes 4007/4009 → a new session (IDENTIFY) on the next connection.

No message is lost or doubled across a drop: a dispatch's sequence number is stored (the
channel's cursor) only once the message is admitted, and the session id with it, so the
next holder — this worker after a drop, or another after a crash — resumes from what
was stored; Discord replays what came after it, and what was already admitted stops at
the dedup (the message id).

Why a client of our own over `websockets` and not discord.py's: discord.py's
DiscordWebSocket belongs to its Client (the gateway URL fetched through a process-wide
`Route.BASE`, events handed to its cache, the sequence number advanced on receipt): it
cannot resume from a sequence number stored *after* the admission, which is the
guarantee above. Its names are used here: the opcodes and the intents.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import TYPE_CHECKING, Any

import discord
import httpx
import websockets
from discord.gateway import DiscordWebSocket as Op
from websockets.exceptions import ConnectionClosed

from agentloop.core.caches import BoundedCache
from conversations.models import Channel
from conversations.platforms.discord import buttons, inbound
from conversations.platforms.discord.transport import DiscordTransport
from conversations.platforms.inbound import Connection, Parsed, Receive
from delivery.transports import SendResult

if TYPE_CHECKING:  # for annotations only
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)

DEADLINE = 10.0  # seconds: the gateway URL asked, the socket opened, Hello awaited
VERSION = "?v=10&encoding=json"
WANTED = ("READY", "MESSAGE_CREATE", "MESSAGE_UPDATE", "MESSAGE_DELETE", "INTERACTION_CREATE")  # stored; other dispatches only counted
RESUMABLE_CLOSE = 4000  # a close other than 1000/1001 keeps the session resumable
NEW_SESSION_CLOSES = (4007, 4009)  # invalid sequence number, session timed out
FATAL_CLOSES = (4004, 4010, 4011, 4012, 4013, 4014)  # bad token, shards, version, intents: an operator's to fix


def intents() -> int:
    """Guild and DM messages with their content: what the bot must be granted (the
    Message Content intent is a privileged one, switched on in the Developer Portal)."""
    wanted = discord.Intents.none()
    wanted.guilds = wanted.guild_messages = wanted.dm_messages = wanted.message_content = True
    return wanted.value


class GatewayRefused(Exception):
    """Discord closed the Gateway for a reason trying again cannot mend (a wrong token,
    intents not granted): logged by the worker, tried again after its longest backoff."""


# Sessions Discord said are over (INVALID_SESSION, 4007, 4009) while the channel's stored
# state still names them: the next connection identifies instead of resuming. Bounded.
_ended: BoundedCache[int, str] = BoundedCache(maxsize=1000, max_age=3600)


class DiscordConnection(Connection):
    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        await GatewaySession(channel, cursor, receive).run()

    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        if not isinstance(payload, dict):
            return None
        bot_user_id = str((channel.poll_session or {}).get("bot_user_id") or "")
        items = inbound.parse_all(str(payload.get("t") or ""), payload.get("d"), bot_user_id)
        return Parsed(items) if items else None

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, buttons.Tap):
            return buttons.decide(channel, item)
        if isinstance(item, inbound.SessionStarted):
            # Stored before the cursor READY came with (the same call): a holder that reads
            # a cursor of this session reads its id too.
            Channel.objects.filter(pk=channel.pk).update(poll_session=item.state())
            return item
        return super().apply(channel, item)


class GatewaySession:
    """One connection, from the Hello to the drop."""

    def __init__(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        self.channel, self.receive = channel, receive
        self.token = str(channel.setting("bot_token") or "")
        state = channel.poll_session or {}
        self.session_id, self.resume_url = str(state.get("session_id") or ""), str(state.get("resume_url") or "")
        if _ended.get(channel.pk) == self.session_id or cursor is None:
            self.session_id = ""
        self.seq = cursor if self.session_id else None
        self.acked = True

    async def run(self) -> None:
        url = self.resume_url if self.session_id and self.resume_url else await self.gateway_url()
        async with websockets.connect(url.rstrip("/") + "/" + VERSION, open_timeout=DEADLINE, close_timeout=2,
                                      max_size=2**22) as socket:
            hello = json.loads(await asyncio.wait_for(socket.recv(), DEADLINE))
            if hello.get("op") != Op.HELLO:
                raise ConnectionError(f"the Gateway opened with op {hello.get('op')!r}, not Hello")
            beating = asyncio.create_task(self.beat(socket, float(hello["d"]["heartbeat_interval"]) / 1000))
            try:
                await socket.send(json.dumps(self.resume() if self.session_id else self.identify()))
                async for frame in socket:
                    if not await self.handle(socket, json.loads(frame)):
                        return
            except ConnectionClosed as closed:
                self.closed(closed)
            finally:
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
                # Ended here (the lease lost, the worker stopping): Discord ends a session
                # closed with 1000 or 1001, so the close says 4000 — the next holder resumes.
                await socket.close(RESUMABLE_CLOSE)

    async def gateway_url(self) -> str:
        base = str(self.channel.setting("api_base")).rstrip("/")
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            answer = await asyncio.wait_for(
                client.get(f"{base}/gateway/bot", headers={"Authorization": f"Bot {self.token}"}), DEADLINE)
        if answer.status_code == 401:
            raise GatewayRefused("Discord refused the bot token (GET /gateway/bot answered 401)")
        answer.raise_for_status()
        return str(answer.json()["url"])

    def identify(self) -> dict[str, Any]:
        properties = {"os": "linux", "browser": "agentloop", "device": "agentloop"}
        return {"op": Op.IDENTIFY, "d": {"token": self.token, "intents": intents(), "properties": properties}}

    def resume(self) -> dict[str, Any]:
        return {"op": Op.RESUME, "d": {"token": self.token, "session_id": self.session_id, "seq": self.seq}}

    async def handle(self, socket: ClientConnection, message: dict[str, Any]) -> bool:
        """One frame; False when the session ends here (the socket is closed)."""
        op = message.get("op")
        if op == Op.DISPATCH:
            event, seq = str(message.get("t") or ""), message.get("s")
            if event in WANTED:
                # Admitted and stored before the next frame is read: only then is it ours.
                await self.receive([{"t": event, "d": message.get("d")}], seq if isinstance(seq, int) else None)
            if isinstance(seq, int):
                self.seq = seq
            if event == "INTERACTION_CREATE":
                await self.answer(message.get("d"))
            if event == "READY":
                self.session_id = str((message.get("d") or {}).get("session_id") or "")
            return True
        if op == Op.HEARTBEAT:
            await socket.send(json.dumps({"op": Op.HEARTBEAT, "d": self.seq}))
        elif op == Op.HEARTBEAT_ACK:
            self.acked = True
        elif op == Op.RECONNECT:
            await socket.close(RESUMABLE_CLOSE)
            return False
        elif op == Op.INVALIDATE_SESSION:
            if not message.get("d"):
                _ended.set(self.channel.pk, self.session_id)
                await asyncio.sleep(random.uniform(1, 5))  # Discord's advice before identifying again
            await socket.close(RESUMABLE_CLOSE)
            return False
        return True

    async def answer(self, data: Any) -> None:
        """A tap decided by the admission, answered (best effort: the decision stands)."""
        decided = buttons.answer_for(str(data.get("id") or "")) if isinstance(data, dict) else None
        if decided is None:
            return
        token, body = decided
        sent = await DiscordTransport(self.channel).call("POST", f"/interactions/{data['id']}/{token}/callback", body)
        if isinstance(sent, SendResult):
            log.warning("channel %s: a tap's answer failed: %s", self.channel.slug, sent.error)

    async def beat(self, socket: ClientConnection, interval: float) -> None:
        await asyncio.sleep(interval * random.random())
        while True:
            if not self.acked:  # a zombie connection: closed, resumed on the next
                log.info("channel %s: the Gateway acknowledged no heartbeat; resuming", self.channel.slug)
                await socket.close(RESUMABLE_CLOSE)
                return
            self.acked = False
            await socket.send(json.dumps({"op": Op.HEARTBEAT, "d": self.seq}))
            await asyncio.sleep(interval)

    def closed(self, closed: ConnectionClosed) -> None:
        code = closed.rcvd.code if closed.rcvd is not None else None
        if code in NEW_SESSION_CLOSES:
            _ended.set(self.channel.pk, self.session_id)
        elif code in FATAL_CLOSES:
            reason = closed.rcvd.reason if closed.rcvd is not None else ""
            raise GatewayRefused(f"Discord closed the Gateway with {code} ({reason})")
        # Any other drop: the next connection resumes.
