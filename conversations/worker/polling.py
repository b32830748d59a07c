"""Polling platforms (Telegram's getUpdates) and those that keep a connection (their
Connection's poller): the worker runs one poller per channel the registry's pollers
name, and stops the pollers of channels that are gone. Each platform takes its own lease
(one poller per channel across all workers)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agentloop.core.backoff import DATABASE_FAULTS
from conversations import platforms
from conversations.models import Channel

if TYPE_CHECKING:  # for annotations only
    from conversations.worker.supervisor import Worker

log = logging.getLogger(__name__)

SUPERVISE_EVERY = 5.0


def wanted_pollers() -> dict[int, platforms.Poller]:
    """Every channel to poll or keep a connection open for, with its poller."""
    return {channel_id: poller for poller in platforms.pollers() for channel_id in poller.channel_ids()}


class Polling:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner
        self.pollers: dict[int, asyncio.Task[Any]] = {}

    async def loop(self) -> None:
        while True:
            try:
                wanted = await self.worker.db(wanted_pollers)
                for channel_id in set(wanted) - set(self.pollers):
                    self.pollers[channel_id] = asyncio.create_task(wanted[channel_id].run(self.worker, channel_id))
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
