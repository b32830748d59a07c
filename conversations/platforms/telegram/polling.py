"""Telegram long polling (getUpdates): one poller per bot across all workers (a lease
on the channel's generic poll_owner / poll_lease_until columns), the next offset
persisted after each admitted batch. The worker runs `poll_channel` for every channel
`polling_channels` names (conversations.worker.polling asks the registry)."""

import asyncio
import logging
from datetime import timedelta

import telegram
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from telegram.error import Conflict, InvalidToken, NetworkError, TelegramError

from agentloop.core.backoff import DATABASE_FAULTS, Backoff
from conversations import edits, reactions
from conversations.ingest import Unstorable, admit, record_refusal
from conversations.liveness import owner_gone
from conversations.models import Channel
from conversations.platforms.telegram import callbacks, identity, parsing
from conversations.platforms.telegram.reactions import is_reaction, reaction_from
from conversations.platforms.telegram.transport import bot_url

log = logging.getLogger(__name__)

KIND = "telegram"
POLLING = "polling"
LEASE = timedelta(seconds=60)
LEASE_RETRY_EVERY = 2.0


# --- the database side ----------------------------------------------------------------


def polling_channels() -> list[int]:
    rows = Channel.objects.filter(kind=KIND, is_active=True, platform_settings__mode=POLLING)
    return [pk for pk, values in rows.values_list("pk", "platform_settings") if (values or {}).get("bot_token")]


def take_lease(channel_id, owner, now=None) -> Channel | None:
    """Become (or stay) the one poller of this bot; the channel, or None if another worker
    is. A holder whose process is visibly gone from this host (a restart) is not waited
    for: its lease is taken at once."""
    now = now or timezone.now()
    free = Q(poll_lease_until__isnull=True) | Q(poll_lease_until__lt=now) | Q(poll_owner=owner)
    holder = Channel.objects.filter(pk=channel_id).values_list("poll_owner", flat=True).first()
    if holder and holder != owner and owner_gone(holder):
        free |= Q(poll_owner=holder)  # still a compare-and-swap: only from that holder
    taken = Channel.objects.filter(free, pk=channel_id, is_active=True,
                                   platform_settings__mode=POLLING).update(
        poll_owner=owner, poll_lease_until=now + LEASE)
    return Channel.objects.get(pk=channel_id) if taken else None


def admit_or_refuse(channel, inbound, source: str) -> bool:
    """Admit an update's message; True when it is new. One the database cannot store is
    refused and audited instead (Telegram would resend it forever if we failed)."""
    try:
        return not admit(channel, inbound).duplicate
    except Unstorable as exc:
        record_refusal(channel, inbound, str(exc), source)
        return False


def admit_polled(channel_id, owner, updates: list[dict]) -> int:
    """Admit a polled batch, then persist the next offset. A crash in between re-polls the
    batch, and the durable dedup drops what was already admitted."""
    channel = Channel.objects.get(pk=channel_id)
    admitted = 0
    for data in updates:
        if callbacks.is_callback(data):  # a tap on a question's button
            callbacks.handle_callback(channel, data)
            continue
        if is_reaction(data):  # a note for the next turn, or a question answered: never a turn
            reaction = reaction_from(data)
            if reaction is not None:
                reactions.apply(channel, reaction)
            continue
        try:
            inbound = parsing.item_from_update(parsing.parse_update(data), identity.asker(channel))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("channel %s: skipping malformed update %s: %s", channel.slug, data.get("update_id"), exc)
            continue
        if isinstance(inbound, edits.Edit):
            # Applied in its own transaction, in update order (after its message).
            result = edits.apply_or_refuse(channel, inbound, "long polling")
            admitted += bool(result and not result.duplicate and result.outcome in edits.WAKES_THE_FLUSHER)
            continue
        # A message that cannot be stored is refused alone (audited): the others are
        # admitted and the offset moves past it, so one bad update never stalls the bot
        # (an edit of a message never received is audited and skipped likewise).
        # Any other error propagates: the offset is not advanced, the batch is polled
        # again, and the dedup drops what was admitted before the error.
        admitted += bool(inbound and admit_or_refuse(channel, inbound, "long polling"))
    if updates:
        offset = max(u["update_id"] for u in updates) + 1
        with transaction.atomic():
            Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_offset=offset)
    return admitted


# --- the worker's side (its event loop) -------------------------------------------------


async def poll_channel(worker, channel_id):
    """One poller per bot (a lease): getUpdates with the persisted offset. A network
    failure rebuilds the Bot; the durable dedup keeps a re-delivered batch out."""
    backoff, database = 1.0, Backoff()
    while True:
        try:
            channel = None
            if worker.liveness.holding():  # taken for dead by the others: no lease
                channel = await worker.db(take_lease, channel_id, worker.owner)
        except DATABASE_FAULTS:
            await asyncio.sleep(database.next())  # reported once by the database thread
            continue
        if channel is None:
            # Held by another worker: look again soon — a dead holder's lease is
            # taken over at the first look after its death is seen.
            await asyncio.sleep(LEASE_RETRY_EVERY)
            continue
        bot = telegram.Bot(channel.setting("bot_token"), base_url=bot_url(channel.setting("api_base")))
        try:
            async with bot:
                await bot.delete_webhook()  # getUpdates is refused while a webhook is set
                await poll_batches(worker, bot, channel, database)
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


async def poll_batches(worker, bot, channel, database):
    offset = channel.poll_offset
    while True:
        updates = await bot.get_updates(
            offset=offset, timeout=settings.AGENTLOOP_TELEGRAM_POLL_TIMEOUT,
            allowed_updates=parsing.ALLOWED_UPDATES
        )
        if updates:
            batch = [u.to_dict() for u in updates]
            admitted = await worker.db(admit_polled, channel.pk, worker.owner, batch)
            database.reset()
            offset = max(u.update_id for u in updates) + 1
            if admitted:
                worker.flusher.wakeup.set()
        if not worker.liveness.holding():
            return  # the others may be taking its lease over
        if await worker.db(take_lease, channel.pk, worker.owner) is None:
            return  # another worker took over
