"""The listening half of live updates (the publishing half: agentloop.core.live): one
`Relay` per web process and event loop keeps this process's listener row fresh and,
without Redis, tails the `LiveEvent` table and pushes each row to the groups of this
process's websockets."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from agentloop.core.live import MESSAGE_TYPE, crosses_processes
from agentloop.core.models import LiveEvent, LiveListener

log = logging.getLogger(__name__)

LISTENER_BEAT = 5.0  # seconds between a web process's listener heartbeats
KEEP = timedelta(minutes=5)  # relayed rows are pruned after this


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
