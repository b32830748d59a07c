"""Platforms that keep a connection open per channel (Discord's Gateway, Slack Socket
Mode, Matrix sync) or poll for their updates (Telegram's getUpdates) rather than
receive webhooks.

A platform subclasses conversations.platforms.inbound.Connection (its
Platform.connection() returns one) and gives two things: `session(channel, cursor, receive)`, which connects, resumes from `cursor` and
hands what arrives to `receive`, and `parse(channel, payload)`, one payload into our own
types. The rest is this module's, the same for every such platform:

- One connection per channel across all workers: the worker's supervision
  (conversations.worker.polling) runs `run` for each channel of `channel_ids()`, under the
  channel's lease (Channel.poll_owner / poll_lease_until), renewed while the session
  lasts; a session whose lease is lost, or whose worker lost its liveness lock, is closed.
  Telegram's long polling is one (conversations.platforms.telegram.polling).
- Resumable: `receive(payloads, cursor)` returns once the payloads are admitted and the
  cursor stored (Channel.poll_offset); a dropped connection is opened again from the last
  cursor stored, a crash in between too.
- The same admission as a webhook's (inbound.Intake, which Connection is): unstorable
  input refused and audited first, then each item admitted or applied — what the platform
  sends again after a resume stops at the dedup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from django.db.models import Q
from django.utils import timezone

from agentloop.core.backoff import DATABASE_FAULTS, Backoff
from conversations import deletions, edits
from conversations.ingest import Admission
from conversations.liveness import owner_gone
from conversations.models import Channel
from conversations.platforms.inbound import Connection

if TYPE_CHECKING:  # for annotations only
    from collections.abc import Sequence

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=60)
RENEW_EVERY = 20.0  # seconds: the lease renewed well before it runs out
LEASE_RETRY_EVERY = 2.0  # seconds between looks at a lease another worker holds
RECONNECT_AFTER = 1.0  # seconds after a session the platform closed, before opening the next
HOLDING_LOOK_EVERY = 1.0  # seconds: a worker that lost its liveness lock ends its sessions this soon

class _Liveness(Protocol):
    def holding(self) -> bool: ...


class _Wakeup(Protocol):
    def set(self) -> None: ...


class _Flusher(Protocol):
    @property
    def wakeup(self) -> _Wakeup: ...


class WorkerSide(Protocol):
    """What a connection needs of the worker that runs it (conversations.worker.supervisor.Worker)."""

    @property
    def owner(self) -> str: ...

    @property
    def liveness(self) -> _Liveness: ...

    @property
    def flusher(self) -> _Flusher | None: ...

    @property
    def db(self) -> Callable[..., Awaitable[Any]]: ...


# --- the worker's side (its event loop) -------------------------------------------------


async def run(connection: Connection, worker: WorkerSide, channel_id: int) -> None:
    """One channel's connection for as long as the worker runs it: held under the
    channel's lease, opened again after every drop (a failure waits a growing delay)."""
    failures, database = Backoff(first=1.0, cap=60.0), Backoff()
    while True:
        try:
            channel = await worker.db(take_lease, channel_id, worker.owner) if worker.liveness.holding() else None
        except DATABASE_FAULTS:
            await asyncio.sleep(database.next())  # reported once by the database thread
            continue
        if channel is None:  # held by another worker: a dead holder's lease is taken at a later look
            await asyncio.sleep(LEASE_RETRY_EVERY)
            continue
        try:
            await held(connection, worker, channel)
            failures.reset()
            await asyncio.sleep(RECONNECT_AFTER)  # closed by the platform, or the lease lost
        except DATABASE_FAULTS:
            await asyncio.sleep(database.next())  # what was received is sent again after the resume
        except Exception as exc:  # the connection must not die with one failure
            log.warning("channel %s: connection failed (%r); again in a moment", channel.slug, exc)
            await asyncio.sleep(failures.next())


async def held(connection: Connection, worker: WorkerSide, channel: Channel) -> None:
    """One session, for as long as the lease stays this worker's (renewed meanwhile) and
    the worker holds its liveness lock (without it, the others take it for dead and may
    take the lease over: it must not stay connected meanwhile)."""
    receive = partial(_receive, connection, worker, channel.pk)
    session = asyncio.create_task(connection.session(channel, channel.poll_offset, receive))
    loop = asyncio.get_running_loop()
    renew_at = loop.time() + RENEW_EVERY
    try:
        while True:
            done, _ = await asyncio.wait({session}, timeout=min(HOLDING_LOOK_EVERY, max(renew_at - loop.time(), 0)))
            if done:
                return session.result()  # its error, if it failed
            if not worker.liveness.holding():
                return  # another worker may take it over: this session ends
            if loop.time() >= renew_at:
                if await worker.db(take_lease, channel.pk, worker.owner) is None:
                    return  # another worker took it over
                renew_at = loop.time() + RENEW_EVERY
    finally:
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)


async def _receive(connection: Connection, worker: WorkerSide, channel_id: int, payloads: Sequence[Any],
                   cursor: int | None) -> int:
    new: int = await worker.db(admit_received, connection, channel_id, worker.owner, payloads, cursor)
    if new and worker.flusher is not None:
        worker.flusher.wakeup.set()
    return new


# --- the database side ------------------------------------------------------------------


def take_lease(channel_id: int, owner: str, now: datetime | None = None) -> Channel | None:
    """Become (or stay) the one holder of this channel's connection; the channel, or None
    when another worker is. A holder visibly gone from this host (a restart) is not
    waited for: its lease is taken at once (still a compare-and-swap)."""
    now = now or timezone.now()
    free = Q(poll_lease_until__isnull=True) | Q(poll_lease_until__lt=now) | Q(poll_owner=owner)
    holder = Channel.objects.filter(pk=channel_id).values_list("poll_owner", flat=True).first()
    if holder and holder != owner and owner_gone(holder):
        free |= Q(poll_owner=holder)
    taken = Channel.objects.filter(free, pk=channel_id, is_active=True).update(poll_owner=owner,
                                                                              poll_lease_until=now + LEASE)
    return Channel.objects.get(pk=channel_id) if taken else None


def admit_received(connection: Connection, channel_id: int, owner: str, payloads: Sequence[Any],
                   cursor: int | None) -> int:
    """Admit what the connection received, then store its cursor (while the lease is
    still this owner's). A crash in between resumes from the older cursor: the platform
    sends the same items again and the dedup drops what got in."""
    channel = Channel.objects.get(pk=channel_id)
    new = 0
    for payload in payloads:
        parsed = connection.parse(channel, payload)
        if parsed is not None:
            new += sum(_wakes(result) for result in connection.results(connection.receive(channel, parsed)))
    if cursor is not None:
        Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_offset=cursor)
    return new


def _wakes(result: object) -> bool:
    """A new message, or an edit or deletion the flusher must act on."""
    if isinstance(result, Admission):
        return not result.duplicate
    if isinstance(result, edits.EditResult | deletions.DeletionResult):
        return not result.duplicate and result.outcome in (*edits.WAKES_THE_FLUSHER, *deletions.WAKES_THE_FLUSHER)
    return False
