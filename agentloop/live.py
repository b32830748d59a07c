"""Live updates for the console: one way to publish, two ways across processes.

The code that changes something calls `publish(groups, event)` inside its transaction.

- With Redis (`REDIS_URL`: channels-redis), the event goes to the channel-layer groups
  once the transaction commits.
- Without it — `make run`: SQLite, several processes, and channels' in-memory layer
  cannot cross them — the event is a `LiveEvent` row written in the same transaction
  (so a rolled-back change publishes nothing). Every web process runs one `Relay` that
  tails the table and pushes the rows to its own websockets' groups.

Either way nothing is written or sent while nobody watches: the console's websockets
keep a `LiveListener` row fresh, and publishers look at it (cached for a second).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.utils import timezone

from agentloop.models import LiveEvent, LiveListener
from audit.redaction import redact_payload

log = logging.getLogger(__name__)

DASHBOARD = "console.dashboard"
MESSAGE_TYPE = "live.event"  # consumers handle it in `live_event`

Event = dict[str, Any]  # JSON-able, with a "kind"
Items = list[tuple[tuple[str, ...], Event]]  # (groups, event) pairs, redacted

LISTENER_FRESH = timedelta(seconds=15)  # a listener row older than this is gone
LISTENER_BEAT = 5.0  # seconds between a web process's listener heartbeats
LISTENING_CACHE = 1.0  # seconds a publisher trusts its last look at the listeners
KEEP = timedelta(minutes=5)  # relayed rows are pruned after this


def conversation_group(conversation_id: int | str) -> str:
    """The group of one conversation's watchers (the playground; the webchat transport
    pushes replies to the same group)."""
    return f"webchat.{conversation_id}"


def crosses_processes() -> bool:
    """True when the channel layer itself reaches every process (Redis)."""
    layer = get_channel_layer()
    return layer is not None and not isinstance(layer, InMemoryChannelLayer)


# --- publishing -----------------------------------------------------------------------

_listening = (0.0, False)


def anyone_listening() -> bool:
    global _listening
    checked_at, answer = _listening
    if time.monotonic() - checked_at > LISTENING_CACHE:
        answer = LiveListener.objects.filter(seen_at__gte=timezone.now() - LISTENER_FRESH).exists()
        _listening = (time.monotonic(), answer)
    return answer


def forget_listeners() -> None:
    """Tests: look again at the next publish."""
    global _listening
    _listening = (0.0, False)


def publish(groups: Iterable[str], event: Event) -> None:
    publish_many([(groups, event)])


def publish_many(items: Iterable[tuple[Iterable[str], Event]]) -> None:
    """`items`: (groups, event) pairs; an event is a JSON-able dict with a "kind"."""
    given = [(tuple(groups), event) for groups, event in items if groups]
    if not given or not anyone_listening():
        return
    redacted: Items = [(groups, redact_payload(event)) for groups, event in given]  # no secret reaches a websocket
    if crosses_processes():
        transaction.on_commit(lambda: _send(redacted))
    else:
        LiveEvent.objects.bulk_create([LiveEvent(groups=" ".join(groups), payload=event) for groups, event in redacted])


async def apublish(groups: Iterable[str], event: Event) -> None:
    """`publish` for code running on an event loop (the worker's transports)."""
    if not await database_sync_to_async(anyone_listening)():
        return
    if crosses_processes():
        await _asend([(tuple(groups), redact_payload(event))])
    else:
        await database_sync_to_async(publish)(groups, event)


def _send(items: Items) -> None:
    try:
        async_to_sync(_asend)(items)
    except Exception as exc:  # the change is committed; a lost live update is only cosmetic
        log.warning("live update not sent: %s", exc)


async def _asend(items: Items) -> None:
    layer = get_channel_layer()
    for groups, event in items:
        for group in groups:
            await layer.group_send(group, {"type": MESSAGE_TYPE, "event": event})


# --- listening (web processes) -------------------------------------------------------------


class Relay:
    """One per web process and event loop: keeps this process's listener row fresh and,
    without Redis, tails `LiveEvent` and pushes each row to its groups on the local
    layer. Runs while at least one console websocket is open here."""

    POLL = 0.15
    SETTLE = 2.0  # seconds a gap in the ids may stay open (a transaction not yet committed)

    def __init__(self) -> None:
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.subscribers = 0
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.floor = 0  # every id up to here was relayed or given up on
        self.seen: set[int] = set()  # ids above the floor already relayed
        self.gap_since: float | None = None

    async def subscribe(self) -> None:
        self.subscribers += 1
        if self.task is None or self.task.done():
            # Created before any await: two websockets connecting at once start one relay.
            self.ready = asyncio.Event()
            self.task = asyncio.create_task(self._run())
        await self.ready.wait()  # listening (and the floor set) before the page is told it is live

    async def unsubscribe(self) -> None:
        self.subscribers = max(0, self.subscribers - 1)
        if self.subscribers == 0 and self.task is not None:
            self.task.cancel()
            self.task = None
            await database_sync_to_async(self._leave)()

    async def _run(self) -> None:
        try:
            await database_sync_to_async(self._beat)()
            if not crosses_processes():
                self.floor, self.seen, self.gap_since = await database_sync_to_async(self._last_id)(), set(), None
        except Exception:
            log.exception("live relay could not start; retrying in its loop")
        finally:
            self.ready.set()  # never leave a connecting websocket waiting
        beat_at = time.monotonic()
        while True:
            try:
                if time.monotonic() - beat_at >= LISTENER_BEAT:
                    beat_at = time.monotonic()
                    await database_sync_to_async(self._beat)()
                if not crosses_processes():
                    await self.relay_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("live relay step failed")
                await asyncio.sleep(1.0)
            await asyncio.sleep(self.POLL if not crosses_processes() else LISTENER_BEAT)

    async def relay_once(self) -> None:
        rows = await database_sync_to_async(self._rows_after)(self.floor)
        layer = get_channel_layer()
        for pk, groups, payload in rows:
            if pk in self.seen:
                continue
            self.seen.add(pk)
            for group in groups.split():
                await layer.group_send(group, {"type": MESSAGE_TYPE, "event": payload})
        self._advance_floor()

    def _advance_floor(self) -> None:
        """Ids are handed out before commit, so a lower id can become visible after a
        higher one (PostgreSQL): the floor moves over contiguous ids only, and over a
        gap once it stayed open longer than any transaction of ours lasts."""
        while self.floor + 1 in self.seen:
            self.floor += 1
            self.seen.discard(self.floor)
        if not self.seen:
            self.gap_since = None
        elif self.gap_since is None:
            self.gap_since = time.monotonic()
        elif time.monotonic() - self.gap_since > self.SETTLE:
            self.floor = min(self.seen) - 1
            self.gap_since = None
            self._advance_floor()

    @staticmethod
    def _last_id() -> int:
        last = LiveEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
        return last or 0

    @staticmethod
    def _rows_after(floor: int) -> list[tuple[int, str, Any]]:
        return list(LiveEvent.objects.filter(pk__gt=floor).order_by("pk").values_list("pk", "groups", "payload")[:500])

    def _beat(self) -> None:
        LiveListener.objects.update_or_create(name=self.name, defaults={"seen_at": timezone.now()})
        LiveEvent.objects.filter(at__lt=timezone.now() - KEEP).delete()

    def _leave(self) -> None:
        LiveListener.objects.filter(name=self.name).delete()


_relays: dict[int, Relay] = {}


def relay() -> Relay:
    """This event loop's relay."""
    loop = asyncio.get_running_loop()
    if id(loop) not in _relays:
        _relays[id(loop)] = Relay()
    return _relays[id(loop)]
