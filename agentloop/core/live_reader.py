"""Reading one live group from a request (the API's SSE stream: a turn's deltas), the
other half of agentloop.core.live for code that is not a console websocket.

- With Redis the reader has a channel of its own on the channel layer, added to the
  group: events arrive as they are published, from any process.
- Without it the reader tails the `LiveEvent` table for rows naming its group (every
  `POLL` seconds, one indexed query) from the newest row when it started.

Either way it keeps a `LiveListener` row of its own fresh while it reads, so publishers
publish (nothing is written or sent while nobody listens), and removes it when done.
Best effort: an event committed late (a lower id seen after a higher one) may be
missed; what is read this way is never the durable answer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar, TypeVarTuple

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from agentloop.core.live import LISTENER_FRESH, MESSAGE_TYPE, Event, crosses_processes
from agentloop.core.models import LiveEvent, LiveListener

POLL = 0.15  # seconds between two looks at the table (without Redis)
BEAT = LISTENER_FRESH.total_seconds() / 3  # the listener row is refreshed this often
KEEP = timedelta(minutes=5)  # rows older than this are pruned (as the console's relay does)
_serial = itertools.count(1)
Result = TypeVar("Result")
Args = TypeVarTuple("Args")


def _db(fn: Callable[[*Args], Result], *args: *Args) -> Awaitable[Result]:
    runs: Awaitable[Result] = database_sync_to_async(fn, thread_sensitive=False)(*args)  # channels: untyped
    return runs


class GroupReader:
    """`async with GroupReader(group) as reader: events = await reader.read(timeout)`."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.name = f"{socket.gethostname()}:{os.getpid()}:read:{next(_serial)}"[:120]
        self.channel = ""
        self.floor = 0
        self.beat_at = 0.0

    async def __aenter__(self) -> GroupReader:
        await _db(self._beat)
        if crosses_processes():
            layer = get_channel_layer()
            self.channel = await layer.new_channel()
            await layer.group_add(self.group, self.channel)
        else:
            self.floor = await _db(_last_id)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.channel:
            try:
                await get_channel_layer().group_discard(self.group, self.channel)
            except Exception:
                pass  # the layer away: its group entries expire on their own
        await asyncio.shield(_db(_leave, self.name))

    async def read(self, timeout: float) -> list[Event]:
        """The events published to the group since the last read, waiting up to
        `timeout` seconds for the first; [] when none came."""
        if time.monotonic() - self.beat_at >= BEAT:
            await _db(self._beat)
        if self.channel:
            try:
                message = await asyncio.wait_for(get_channel_layer().receive(self.channel), timeout)
            except TimeoutError:
                return []
            return [message["event"]] if message.get("type") == MESSAGE_TYPE else []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.floor, events = await _db(_rows_after, self.floor, self.group)
            if events:
                return events
            left = deadline - loop.time()
            if left <= 0:
                return []
            await asyncio.sleep(min(POLL, left))

    def _beat(self) -> None:
        self.beat_at = time.monotonic()
        LiveListener.objects.update_or_create(name=self.name, defaults={"seen_at": timezone.now()})
        LiveEvent.objects.filter(at__lt=timezone.now() - KEEP).delete()


def _last_id() -> int:
    return LiveEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _rows_after(floor: int, group: str) -> tuple[int, list[Event]]:
    """The new floor (past every row looked at: "api.1" also finds "api.12"'s) and the
    group's events above the old one."""
    rows = list(LiveEvent.objects.filter(pk__gt=floor, groups__contains=group).order_by("pk")
                .values_list("pk", "groups", "payload")[:200])
    return (rows[-1][0] if rows else floor), [payload for _, groups, payload in rows if group in groups.split()]


def _leave(name: str) -> None:
    LiveListener.objects.filter(name=name).delete()
