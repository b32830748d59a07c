"""The typing indicators' look at the database, on their own thread (the loops that show
them: conversations.worker.typing): the channels whose windows are typed, the workers
alive to share those windows between, and the windows open now in this worker's part."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from agentloop.core.rows import epoch
from conversations import sql
from conversations.models import Channel, GroupReplies, StatusReaction, TypingMode, WorkerHeartbeat
from conversations.platforms import typing_kinds


@dataclass(frozen=True)
class Window:
    """An open buffer a look found, on a channel that types from the first message."""

    conversation_id: int
    buffer_id: int
    chat_id: str
    thread_id: str
    channel_id: int
    flush_at: float | None = None  # epoch seconds: when the buffer flushes, as the look saw it
    # The last message's platform id: WhatsApp shows "typing…" against it (Telegram and
    # the web chat do not need it).
    reply_target: str = ""


def typing_channels() -> dict[int, Channel]:
    """Active channels that show typing from the first message, or a status reaction
    (conversations/worker/reactions.py), by id: the look's windows are theirs."""
    return {channel.pk: channel for channel in Channel.objects.filter(
        Q(typing_mode=TypingMode.INSTANT, kind__in=typing_kinds()) | ~Q(status_reaction=StatusReaction.OFF),
        is_active=True)}


def live_owners(dead: Iterable[str]) -> list[str]:
    """The workers alive as far as this one knows: heartbeats, less those found dead."""
    dead = set(dead)
    return sorted(owner for owner in WorkerHeartbeat.objects.values_list("owner", flat=True) if owner not in dead)


def open_windows(channel_ids: list[int], part: int, parts: int, limit: int) -> list[Window]:
    """One statement: the open buffers of these channels' conversations whose id falls
    in this worker's part, oldest buffer first (a window being typed stays in the first
    `limit` until it closes), with the thread (forum topics) and the platform id of the
    buffer's last message (`conversations.sql.open_windows`: in proportion to the
    buffers open now, never to a channel's conversations — a bot's millions of chats,
    nearly all of them quiet)."""
    if not channel_ids:
        return []
    rows = sql.open_windows(channel_ids, part, parts, limit)
    # A group's burst shows "typing…" only if it will be answered (conversations.groups).
    modes = _group_replies({row[5] for row in rows if row[7] is not None})
    return [Window(conversation, buffer, chat, thread or "", channel, epoch(flush_at), reply_target or "")
            for conversation, buffer, chat, thread, reply_target, channel, flush_at, addressed in rows
            if addressed is None or modes.get(channel) == GroupReplies.ALWAYS
            or (addressed and modes.get(channel) == GroupReplies.MENTION)]


def _group_replies(channel_ids: set[int]) -> dict[int, str]:
    """{channel id: its group_replies}: asked only when a look found a group's window."""
    if not channel_ids:
        return {}
    return dict(Channel.objects.filter(pk__in=channel_ids).values_list("pk", "group_replies"))
