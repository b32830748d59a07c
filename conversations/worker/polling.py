"""Telegram long polling: one poller per bot across all workers (a lease)."""

import asyncio
import logging

import telegram
from django.conf import settings
from telegram.error import Conflict, InvalidToken, NetworkError, TelegramError

from conversations import telegram as telegram_inbound
from conversations.worker.backoff import Backoff
from conversations.worker.dbthread import DATABASE_FAULTS

log = logging.getLogger(__name__)

SUPERVISE_EVERY = 5.0
LEASE_RETRY_EVERY = 2.0


class Polling:
    def __init__(self, worker):
        self.worker = worker
        self.owner = worker.owner
        self.pollers: dict[int, asyncio.Task] = {}

    async def loop(self):
        while True:
            try:
                wanted = set(await self.worker.db(telegram_inbound.polling_channels))
                for channel_id in wanted - set(self.pollers):
                    self.pollers[channel_id] = asyncio.create_task(self.poll_channel(channel_id))
                for channel_id in set(self.pollers) - wanted:
                    self.pollers.pop(channel_id).cancel()
            except DATABASE_FAULTS:
                pass  # reported once by the database thread; the pollers keep going
            except Exception:
                log.exception("poller supervision failed")
            await asyncio.sleep(SUPERVISE_EVERY)

    async def poll_channel(self, channel_id):
        """One poller per bot (a lease): getUpdates with the persisted offset. A network
        failure rebuilds the Bot; the durable dedup keeps a re-delivered batch out."""
        backoff, database = 1.0, Backoff()
        while True:
            try:
                channel = None
                if self.worker.liveness.holding():  # taken for dead by the others: no lease
                    channel = await self.worker.db(telegram_inbound.take_lease, channel_id, self.owner)
            except DATABASE_FAULTS:
                await asyncio.sleep(database.next())  # reported once by the database thread
                continue
            if channel is None:
                # Held by another worker: look again soon — a dead holder's lease is
                # taken over at the first look after its death is seen.
                await asyncio.sleep(LEASE_RETRY_EVERY)
                continue
            bot = telegram.Bot(channel.bot_token, base_url=f"{channel.api_base.rstrip('/')}/bot")
            try:
                async with bot:
                    await bot.delete_webhook()  # getUpdates is refused while a webhook is set
                    await self.poll_batches(bot, channel, database)
                backoff = 1.0
            except DATABASE_FAULTS:
                # Admitting failed: the batch was not confirmed and is polled again (the
                # dedup drops what got in) as soon as the database answers.
                await asyncio.sleep(database.next())
            except (NetworkError, Conflict) as exc:
                log.warning("channel %s: polling failed (%s); rebuilding in %.0fs", channel.slug, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
            except (InvalidToken, TelegramError) as exc:
                log.error("channel %s: polling stopped: %s", channel.slug, exc)
                await asyncio.sleep(60.0)
            except Exception:
                # Whatever it was, the poller must not die; an unconfirmed batch is
                # polled again (the dedup drops what got in).
                log.exception("channel %s: polling failed; retrying in %.0fs", channel.slug, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)

    async def poll_batches(self, bot, channel, database):
        offset = channel.poll_offset
        while True:
            updates = await bot.get_updates(
                offset=offset, timeout=settings.AGENTLOOP_TELEGRAM_POLL_TIMEOUT,
                allowed_updates=telegram_inbound.ALLOWED_UPDATES
            )
            if updates:
                batch = [u.to_dict() for u in updates]
                admitted = await self.worker.db(telegram_inbound.admit_polled, channel.pk, self.owner, batch)
                database.reset()
                offset = max(u.update_id for u in updates) + 1
                if admitted:
                    self.worker.flusher.wakeup.set()
            if not self.worker.liveness.holding():
                return  # the others may be taking its lease over
            if await self.worker.db(telegram_inbound.take_lease, channel.pk, self.owner) is None:
                return  # another worker took over

    async def stop(self):
        for task in self.pollers.values():
            task.cancel()
        await asyncio.gather(*self.pollers.values(), return_exceptions=True)

    def release_leases(self):
        for channel_id in list(self.pollers):
            telegram_inbound.release_lease(channel_id, self.owner)
