"""Matrix's `/sync`, long-polled per channel by the worker (conversations.platforms.
connection: one holder per bot account across workers and hosts, under the channel's
lease), through matrix-nio's AsyncClient (the request, its answer parsed, and the rooms'
state it keeps: who is in a room, their display names).

The session: `whoami` (the token's user and device) → `/sync` from the stored position
(`since`; the first sync of a session asks for the rooms' full state, so a new holder
knows every room's members) → each joined room's timeline events handed to the
admission with, last, the batch's `next_batch`; the position is stored in the channel's
poll_session only after the events before it are admitted (the connection runner applies
a batch's items in order), then the next long poll. A crash or a drop in between resumes
from the older position: the homeserver sends the same events again and the dedup (the
event id) drops what got in. No message is lost or doubled across a restart — of the
worker or of the homeserver.

The very first sync of a channel (no position stored) only takes the position: what was
said in the rooms before the bot was connected is not answered.

Invites are joined when the channel's `auto_join` is on (logged either way). A timeline
the homeserver cut short (`limited`: more events than the filter's limit since the last
position, after a long outage) is logged: the events before the cut are not fetched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import ClientConnectionError
from nio import AsyncClient, AsyncClientConfig, JoinError, SyncError, SyncResponse, WhoamiError

from conversations.ingest import record_refusal
from conversations.models import Channel
from conversations.platforms.inbound import Connection, Parsed, Receive
from conversations.platforms.matrix import events

if TYPE_CHECKING:  # for annotations only
    from nio import MatrixRoom

log = logging.getLogger(__name__)
# nio logs every event of every sync at INFO (a line per state event of each room): only
# its warnings are the worker's to keep.
logging.getLogger("nio").setLevel(logging.WARNING)

LONG_POLL_MS = 30_000  # how long the homeserver holds a /sync open when nothing happens
DEADLINE = 20.0  # seconds beyond the long poll before a /sync (or whoami, a join) counts as lost
# A homeserver restarting (its socket refused or dropped) is waited for here, looked at
# every REJOIN_EVERY s, before the failure goes to the runner's growing backoff.
REJOIN_EVERY, REJOIN_FOR = 0.5, 15.0
TIMELINE_LIMIT = 200  # events per room per sync before the homeserver cuts the timeline short
SYNC_FILTER = {"room": {"timeline": {"limit": TIMELINE_LIMIT}}, "presence": {"types": []},
               "account_data": {"types": []}}


class MatrixRefused(Exception):
    """The homeserver refused the access token (M_UNKNOWN_TOKEN, M_FORBIDDEN): an
    operator's to fix; logged by the worker, tried again after its longest backoff."""


class MatrixConnection(Connection):
    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        await SyncSession(channel, cursor, receive).run()

    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        item = events.parse(payload)
        return Parsed([item]) if item is not None else None

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, events.SyncPosition):
            state = dict(Channel.objects.filter(pk=channel.pk).values_list("poll_session", flat=True).first() or {})
            state.update(next_batch=item.next_batch, user_id=item.user_id)
            Channel.objects.filter(pk=channel.pk).update(poll_session=state)
            return item
        if isinstance(item, events.Encrypted):
            record_refusal(channel, item, events.ENCRYPTED_REFUSAL, "matrix")  # logged too
            return item
        return super().apply(channel, item)


class SyncSession:
    """One connection: whoami, then long polls until something fails."""

    def __init__(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        self.channel, self.receive, self.count = channel, receive, cursor or 0
        self.since = str((channel.poll_session or {}).get("next_batch") or "") or None
        self.client = AsyncClient(str(channel.setting("homeserver")).rstrip("/"), config=AsyncClientConfig(
            max_limit_exceeded=0, max_timeouts=0, request_timeout=DEADLINE, store_sync_tokens=False))
        self.client.access_token = str(channel.setting("access_token") or "")
        self.known: set[str] = set()  # rooms of an earlier sync of this session

    async def run(self) -> None:
        try:
            await self.login()
            full_state, lost_at = True, None
            loop = asyncio.get_running_loop()
            while True:
                try:
                    await self.sync_once(full_state)
                except ClientConnectionError as exc:
                    if lost_at is None:  # logged once per outage
                        lost_at = loop.time()
                        log.info("channel %s: the homeserver is unreachable (%r); looking again every %g s",
                                 self.channel.slug, exc, REJOIN_EVERY)
                    elif loop.time() - lost_at > REJOIN_FOR:
                        raise
                    await asyncio.sleep(REJOIN_EVERY)
                    continue
                if lost_at is not None:
                    log.info("channel %s: the homeserver is back after %.1f s", self.channel.slug, loop.time() - lost_at)
                full_state, lost_at = False, None
        finally:
            await self.client.close()

    async def login(self) -> None:
        who = await asyncio.wait_for(self.client.whoami(), DEADLINE)
        if isinstance(who, WhoamiError):
            if who.status_code in ("M_UNKNOWN_TOKEN", "M_FORBIDDEN", "M_MISSING_TOKEN"):
                raise MatrixRefused(f"the homeserver refused the access token: {who.status_code} {who.message}")
            raise ConnectionError(f"whoami failed: {who.status_code} {who.message}")
        self.client.restore_login(who.user_id, who.device_id or "", self.client.access_token)

    async def sync_once(self, full_state: bool) -> None:
        answered = await asyncio.wait_for(self.client.sync(
            timeout=0 if full_state else LONG_POLL_MS, sync_filter=SYNC_FILTER, since=self.since,
            full_state=full_state or None), LONG_POLL_MS / 1000 + DEADLINE)
        if isinstance(answered, SyncError):
            await self.sync_failed(answered)
            return
        assert isinstance(answered, SyncResponse)
        payloads = self.payloads(answered) if self.since is not None else []  # the first ever: the position only
        self.count += 1
        await self.receive([*payloads, {"next_batch": answered.next_batch, "bot": self.client.user_id}], self.count)
        self.since = answered.next_batch
        await self.join_invites(answered)

    async def sync_failed(self, error: SyncError) -> None:
        if error.status_code == "M_LIMIT_EXCEEDED":
            wait = (error.retry_after_ms or 1000) / 1000
            log.info("channel %s: /sync rate limited; again in %.1f s", self.channel.slug, wait)
            await asyncio.sleep(min(wait, 60.0))
            return
        if error.status_code in ("M_UNKNOWN_TOKEN", "M_FORBIDDEN", "M_MISSING_TOKEN"):
            raise MatrixRefused(f"the homeserver refused the access token: {error.status_code} {error.message}")
        raise ConnectionError(f"/sync failed: {error.status_code} {error.message}")

    def payloads(self, answered: SyncResponse) -> list[dict[str, Any]]:
        found = []
        bot = self.client.user_id
        # A room the bot left (kicked, banned) since the last sync comes under `leave`, with
        # what was said there before: admitted too (nothing lost; a reply is then refused, and
        # the room marked unreachable).
        for room_id, joined in [*answered.rooms.join.items(), *answered.rooms.leave.items()]:
            room = self.client.rooms.get(room_id)
            if joined.timeline.limited and room_id in self.known:  # a room just joined starts limited
                log.warning("channel %s: the homeserver cut room %s's timeline short (over %d events since the "
                            "last sync): the earlier ones are not read", self.channel.slug, room_id, TIMELINE_LIMIT)
            for event in joined.timeline.events:
                source = getattr(event, "source", None)
                if isinstance(source, dict):
                    found.append(self.payload(room_id, room, source, bot))
        self.known.update(answered.rooms.join)
        return found

    @staticmethod
    def payload(room_id: str, room: MatrixRoom | None, event: dict[str, Any], bot: str) -> dict[str, Any]:
        sender = str(event.get("sender") or "")
        return {"room": room_id, "event": event, "bot": bot,
                "members": room.joined_count if room is not None else 0,
                "bot_name": (room.user_name(bot) or "") if room is not None else "",
                "sender_name": (room.user_name(sender) or "") if room is not None and sender else ""}

    async def join_invites(self, answered: SyncResponse) -> None:
        for room_id in answered.rooms.invite:
            if self.channel.setting("auto_join") != "on":
                log.info("channel %s: invited to %s; not joined (auto_join is off)", self.channel.slug, room_id)
                continue
            joined = await asyncio.wait_for(self.client.join(room_id), DEADLINE)
            if isinstance(joined, JoinError):
                log.warning("channel %s: could not join %s: %s %s", self.channel.slug, room_id, joined.status_code,
                            joined.message)
            else:
                log.info("channel %s: joined %s (invited)", self.channel.slug, room_id)
