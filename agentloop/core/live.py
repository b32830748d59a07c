"""Live updates for the console: one way to publish, two ways across processes. This
is the publishing half; the relay that listens in each web process is the console's
(agentloop/console/relay.py).

The code that changes something calls `publish(groups, event)` inside its transaction.

- With Redis (`REDIS_URL`: channels-redis), the event goes to the channel-layer groups
  once the transaction commits.
- Without it — `make run`: SQLite, several processes, and channels' in-memory layer
  cannot cross them — the event is a `LiveEvent` row written in the same transaction
  (so a rolled-back change publishes nothing). Every web process runs one `Relay` (its
  half, agentloop.console.relay) that tails the table and pushes the rows to its own
  websockets' groups.

Either way nothing is written or sent while nobody watches: the console's websockets
keep a `LiveListener` row fresh, and publishers look at it (cached for a second).

Redis going away costs live updates only, never a reply: a send has a deadline
(SEND_DEADLINE), a failed one pauses sending for a back-off (1 s doubling to 30 s) so a
committing step never waits on a Redis that is gone, and the fault is logged once when
it starts (then every 30 s) and once when Redis is back — live updates resume by
themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.utils import timezone

from agentloop.core.backoff import Backoff, FaultLog
from agentloop.core.models import LiveEvent, LiveListener
from agentloop.core.redaction import redact_payload

log = logging.getLogger(__name__)

DASHBOARD = "console.dashboard"
MESSAGE_TYPE = "live.event"  # consumers handle it in `live_event`

Event = dict[str, Any]  # JSON-able, with a "kind"
Items = list[tuple[tuple[str, ...], Event]]  # (groups, event) pairs, redacted

LISTENER_FRESH = timedelta(seconds=15)  # a listener row older than this is gone
LISTENING_CACHE = 1.0  # seconds a publisher trusts its last look at the listeners
SEND_DEADLINE = 1.0  # seconds for one batch of live updates to reach the channel layer


def conversation_group(conversation_id: int | str) -> str:
    """The group of one conversation's watchers (the playground; the webchat transport
    pushes replies to the same group)."""
    return f"webchat.{conversation_id}"


def api_stream_group(conversation_id: int | str) -> str:
    """The group of an API conversation's SSE readers (conversations.api.streaming): the
    API channel's previews (a turn's text so far) are published to it."""
    return f"api.{conversation_id}"


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
    if LAYER.paused():
        return
    try:
        async_to_sync(_asend)(items)
    except Exception as exc:  # the change is committed: whatever failed here, only its live update is lost
        LAYER.failed(exc)


async def _asend(items: Items) -> None:
    """Sent within SEND_DEADLINE, or dropped: the change is committed, and a lost live
    update is only cosmetic (the console's next page load shows it)."""
    if LAYER.paused():
        return
    layer = get_channel_layer()
    try:
        async with asyncio.timeout(SEND_DEADLINE):
            for groups, event in items:
                for group in groups:
                    await layer.group_send(group, {"type": MESSAGE_TYPE, "event": event})
    except Exception as exc:
        LAYER.failed(exc)
    else:
        LAYER.sent()


class LayerFaults:
    """The channel layer's health as this process saw it: while it fails, sends are paused
    for a back-off and the fault is logged once (FaultLog), not once per update."""

    def __init__(self) -> None:
        self.log = FaultLog(log, subject="live updates (channel layer)")
        self.backoff = Backoff(first=1.0, cap=30.0)
        self.paused_until = 0.0

    def paused(self) -> bool:
        return time.monotonic() < self.paused_until

    def failed(self, exc: BaseException) -> None:
        self.log.failed(exc if str(exc) else TimeoutError(f"no answer within {SEND_DEADLINE:g} s"))
        self.paused_until = time.monotonic() + self.backoff.next()

    def sent(self) -> None:
        self.log.recovered()
        self.backoff.reset()


LAYER = LayerFaults()
