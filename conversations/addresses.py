"""A chat's platform address: where the platform wants the chat's replies sent, as its
last inbound message said (the platform contract's optional `Inbound.address`;
docs/adding-a-platform.md). Teams' is its conversation reference: the serviceUrl the
activity came from, the conversation id, the tenant (Bot Framework keeps one per
conversation and replies with it; a serviceUrl may change).

- `remember`: intake's (conversations.ingest), in the admission's transaction, for a
  message admitted (not a duplicate) whose Inbound carries an address: one row per
  (channel, chat), written when the address changed — never per message. What this process
  stored is kept in a bounded cache (once committed), so an unchanged address costs no
  statement.
- `address_for` / `address_of`: a transport's read (blocking / from the event loop) for
  the chat of a Target; None when no message of the chat gave one (a proactive first
  message: the platform's settings decide). Cached: an address this process read or
  wrote for KNOWN_FOR seconds, an unknown chat for UNKNOWN_FOR seconds, so another
  process's change is seen within those.
- `forget`: erasure's (conversations.erasure), the retention sweep deletes the rest
  (conversations.retention): an address goes when its chat's data goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentloop.core.caches import BoundedCache
from agentloop.core.rows import insert
from conversations.models import PlatformAddress

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from delivery.transports import Target

Address = dict[str, str]

MAX_FIELDS = 8
MAX_KEY = 64
MAX_VALUE = 1000
KNOWN_FOR = 300.0
UNKNOWN_FOR = 30.0

# (channel id, chat id) -> its address, for sending: read, or given by a message this
# process admitted (verified by its platform: good to use even if that admission is
# rolled back and retried).
_known: BoundedCache[tuple[int, str], Address] = BoundedCache(maxsize=8192, max_age=KNOWN_FOR)
# (channel id, chat id) -> its address as a committed transaction of this process stored it
# (or found it stored): the same again is no statement.
_stored: BoundedCache[tuple[int, str], Address] = BoundedCache(maxsize=8192, max_age=KNOWN_FOR)
# (channel id, chat id) -> True: no address was stored when this process last looked.
_unknown: BoundedCache[tuple[int, str], bool] = BoundedCache(maxsize=8192, max_age=UNKNOWN_FOR)


def cleaned(address: Mapping[str, str] | None) -> Address:
    """The address as stored: its string fields, bounded (at most MAX_FIELDS, keys of
    MAX_KEY and values of MAX_VALUE characters; an empty or longer value is left out)."""
    found: Address = {}
    for key, value in (address or {}).items():
        if isinstance(key, str) and isinstance(value, str) and 0 < len(key) <= MAX_KEY and 0 < len(value) <= MAX_VALUE:
            found[key] = value
        if len(found) == MAX_FIELDS:
            break
    return found


def remember(channel_id: int, chat_id: str, address: Mapping[str, str] | None) -> bool:
    """Store the chat's address if it changed (inside the caller's transaction); True
    when a row was written. An empty address changes nothing."""
    value = cleaned(address)
    key = (channel_id, chat_id)
    if not value or _stored.get(key) == value:
        return False
    _known.set(key, value)
    _unknown.pop(key)
    rows = PlatformAddress.objects.filter(channel_id=channel_id, chat_id=chat_id)
    stored = list(rows.values_list("address", flat=True)[:1])
    written = False
    if not stored:
        written = insert(PlatformAddress(channel_id=channel_id, chat_id=chat_id, address=value),
                         ("channel_id", "chat_id"))
    if not written and (not stored or stored[0] != value):
        written = rows.update(address=value, updated_at=timezone.now()) > 0
    transaction.on_commit(lambda: _stored.set(key, value))
    return written


def _cached(key: tuple[int, str]) -> tuple[bool, Address | None]:
    """(whether this process knows, the address or None) without a query."""
    held = _known.get(key)
    if held is not None:
        return True, held
    return bool(_unknown.get(key)), None


def address_for(channel: Channel, target: Target) -> Address | None:
    """The address stored for the target's chat (blocking: a query unless cached)."""
    key = (int(channel.pk), target.chat_id)
    known, held = _cached(key)
    if known:
        return held
    stored = list(PlatformAddress.objects.filter(channel_id=channel.pk, chat_id=target.chat_id)
                  .values_list("address", flat=True)[:1])
    value = cleaned(stored[0]) if stored and isinstance(stored[0], dict) else {}
    if not value:
        _unknown.set(key, True)
        return None
    return _known.set(key, value)


async def address_of(channel: Channel, target: Target) -> Address | None:
    """`address_for` from the event loop: a cached answer at once, else the query in
    the database thread (sync_to_async)."""
    known, held = _cached((int(channel.pk), target.chat_id))
    if known:
        return held
    found: Address | None = await sync_to_async(address_for)(channel, target)
    return found


def names(channel: Channel, field: str, base: str) -> bool:
    """Whether a stored address of the channel has `field` equal to `base` or under it
    (`base` followed by "/"): e.g. a host a Teams activity named as its serviceUrl."""
    base = base.rstrip("/")
    under = Q(**{f"address__{field}": base}) | Q(**{f"address__{field}": f"{base}/"}) | \
        Q(**{f"address__{field}__startswith": f"{base}/"})
    return PlatformAddress.objects.filter(under, channel_id=channel.pk).exists()


def forget(channel_id: int, chat_ids: Iterable[str]) -> int:
    """Delete the addresses of these chats (erasure); the count deleted."""
    chats = sorted(set(chat_ids))
    for chat in chats:
        for cache in (_known, _stored, _unknown):
            cache.pop((channel_id, chat))
    if not chats:
        return 0
    deleted: int = PlatformAddress.objects.filter(channel_id=channel_id, chat_id__in=chats).delete()[0]
    return deleted


def forget_cached() -> None:
    """Drop what this process holds (tests; another process's erasure is seen within KNOWN_FOR)."""
    for cache in (_known, _stored, _unknown):
        cache.clear()
