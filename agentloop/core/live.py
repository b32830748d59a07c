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
"""

from __future__ import annotations

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

from agentloop.core.models import LiveEvent, LiveListener
from agentloop.core.redaction import redact_payload

log = logging.getLogger(__name__)

DASHBOARD = "console.dashboard"
MESSAGE_TYPE = "live.event"  # consumers handle it in `live_event`

Event = dict[str, Any]  # JSON-able, with a "kind"
Items = list[tuple[tuple[str, ...], Event]]  # (groups, event) pairs, redacted

LISTENER_FRESH = timedelta(seconds=15)  # a listener row older than this is gone
LISTENING_CACHE = 1.0  # seconds a publisher trusts its last look at the listeners


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
    try:
        async_to_sync(_asend)(items)
    except Exception as exc:  # the change is committed; a lost live update is only cosmetic
        log.warning("live update not sent: %s", exc)


async def _asend(items: Items) -> None:
    layer = get_channel_layer()
    for groups, event in items:
        for group in groups:
            await layer.group_send(group, {"type": MESSAGE_TYPE, "event": event})
