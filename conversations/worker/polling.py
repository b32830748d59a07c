"""The platforms' connections (conversations.platforms.inbound.Connection: Telegram's
long polling, a platform's socket): the worker runs one per channel the registry's
connections name (conversations.platforms.connection.run, under the channel's lease: one
per channel across all workers), and stops those of channels that are gone."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agentloop.core.backoff import DATABASE_FAULTS
from conversations import platforms
from conversations.models import Channel
from conversations.platforms import connection

if TYPE_CHECKING:  # for annotations only
    from conversations.platforms.inbound import Connection
    from conversations.worker.supervisor import Worker

log = logging.getLogger(__name__)

SUPERVISE_EVERY = 5.0


def wanted_connections() -> dict[int, Connection]:
    """Every channel to poll or keep a connection open for, with its platform's connection
    (asked of the platforms that have an active channel only)."""
    kinds = set(Channel.objects.filter(is_active=True).order_by().values_list("kind", flat=True).distinct())
    return {channel_id: kept for kept in platforms.connections(kinds) for channel_id in kept.channel_ids()}


class Polling:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner
        self.pollers: dict[int, asyncio.Task[Any]] = {}

    async def loop(self) -> None:
        while True:
            try:
                wanted = await self.worker.db(wanted_connections)
                for channel_id in set(wanted) - set(self.pollers):
                    self.pollers[channel_id] = asyncio.create_task(
                        connection.run(wanted[channel_id], self.worker, channel_id))
                for channel_id in set(self.pollers) - set(wanted):
                    self.pollers.pop(channel_id).cancel()
            except DATABASE_FAULTS:
                pass  # reported once by the database thread; the pollers keep going
            except Exception:
                log.exception("poller supervision failed")
            await asyncio.sleep(SUPERVISE_EVERY)

    async def stop(self) -> None:
        for task in self.pollers.values():
            task.cancel()
        await asyncio.gather(*self.pollers.values(), return_exceptions=True)

    def release_leases(self) -> None:
        for channel_id in list(self.pollers):
            release_lease(channel_id, self.owner)


def release_lease(channel_id: int, owner: str) -> None:
    Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_owner="", poll_lease_until=None)
