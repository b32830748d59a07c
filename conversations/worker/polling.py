"""Polling platforms (Telegram's getUpdates): the worker runs one poller per channel the
registry's pollers name, and stops the pollers of channels that are gone. Each platform
takes its own lease (one poller per channel across all workers)."""

import asyncio
import logging

from conversations import platforms
from conversations.models import Channel
from conversations.worker.dbthread import DATABASE_FAULTS

log = logging.getLogger(__name__)

SUPERVISE_EVERY = 5.0


def wanted_pollers() -> dict[int, platforms.Poller]:
    """Every channel to poll, with its platform's poller."""
    return {channel_id: poller for poller in platforms.pollers().values() for channel_id in poller.channel_ids()}


class Polling:
    def __init__(self, worker):
        self.worker = worker
        self.owner = worker.owner
        self.pollers: dict[int, asyncio.Task] = {}

    async def loop(self):
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

    async def stop(self):
        for task in self.pollers.values():
            task.cancel()
        await asyncio.gather(*self.pollers.values(), return_exceptions=True)

    def release_leases(self):
        for channel_id in list(self.pollers):
            release_lease(channel_id, self.owner)


def release_lease(channel_id, owner):
    Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_owner="", poll_lease_until=None)
