"""Group chats: which bursts the agent answers, and what the group said meanwhile.

A group's conversation is one (chat, sender) pair, so a burst is one person's. At its
flush the channel's `group_replies` decides: `always` answers it, `never` does not, and
`mention` (the default) answers it only if one of its messages is addressed to the agent
(a mention of the bot or a reply to it — on Slack, a reply in a thread the app is in;
a mention in the first message of a burst counts for the whole burst). Telegram groups
and Slack channels alike. A burst not answered becomes group *context*: its messages
are kept (disposition `context`) and given, with everything else the group said since
the chat's last turn, to the next turn that is addressed to the agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from django.conf import settings

from conversations.models import (
    BufferState,
    Disposition,
    FlushReason,
    GroupReplies,
    InboundMessage,
    MessageBuffer,
    MessageKind,
    Turn,
)

# Messages stored, never answered, that the group's next addressed turn reads: the
# unaddressed ones, and those of bots the channel does not allow (conversations.loops).
KEPT_AS_CONTEXT = (Disposition.CONTEXT, Disposition.BOT)
CONTEXT_HEADER = "[Earlier in the group, not addressed to you]"
ADDRESSED_HEADER = "[Addressed to you]"


def addressed(buffer: MessageBuffer, messages: Iterable[InboundMessage]) -> bool:
    """Whether this burst is answered (a private chat's always is)."""
    conversation = buffer.conversation
    if not conversation.is_group or buffer.carried_turn is not None:
        return True
    mode = conversation.channel.group_replies
    if mode == GroupReplies.ALWAYS:
        return True
    if mode == GroupReplies.NEVER:
        return False
    # None: the platform does not say (an API message): it counts as addressed.
    return any(message.mentioned is not False for message in messages)


def split(buffers: Iterable[MessageBuffer], by_buffer: Mapping[int | None, Sequence[InboundMessage]],
          ) -> tuple[list[MessageBuffer], list[MessageBuffer]]:
    """(answered, kept as context) of claimed buffers."""
    answered: list[MessageBuffer] = []
    context: list[MessageBuffer] = []
    for buffer in buffers:
        (answered if addressed(buffer, by_buffer.get(buffer.pk, [])) else context).append(buffer)
    return answered, context


def keep_as_context(buffers: Iterable[MessageBuffer]) -> None:
    """Claimed buffers that make no turn: their messages become the group's context."""
    ids = [buffer.pk for buffer in buffers]
    if not ids:
        return
    InboundMessage.objects.filter(buffer_id__in=ids).update(disposition=Disposition.CONTEXT)
    MessageBuffer.objects.filter(pk__in=ids).update(flush_reason=FlushReason.UNADDRESSED)


def context_lines(buffer: MessageBuffer, now: datetime) -> list[str]:
    """What the rest of the group said since the chat's last turn, not addressed to the
    agent, oldest first (at most AGENTLOOP_GROUP_CONTEXT_MESSAGES, the newest kept): kept
    context, and messages still waiting in other senders' open buffers."""
    conversation = buffer.conversation
    in_chat = {"conversation__channel_id": conversation.channel_id, "conversation__chat_id": conversation.chat_id}
    last_turn = (Turn.objects.filter(**in_chat, created_at__lt=now).order_by("-created_at")
                 .values_list("created_at", flat=True).first())
    found = (InboundMessage.objects.filter(channel_id=conversation.channel_id,
                                           conversation__chat_id=conversation.chat_id, received_at__lte=now)
             .filter(disposition__in=KEPT_AS_CONTEXT) | InboundMessage.objects.filter(
                 channel_id=conversation.channel_id, conversation__chat_id=conversation.chat_id,
                 received_at__lte=now, buffer__state=BufferState.OPEN, disposition=Disposition.BUFFERED))
    # A message its sender deleted is no one's context (conversations.deletions).
    found = found.exclude(buffer_id=buffer.pk).exclude(kind=MessageKind.CONTROL).filter(deleted_at__isnull=True)
    if last_turn is not None:
        found = found.filter(received_at__gt=last_turn)
    newest = list(found.order_by("-received_at", "-id")
                  .values_list("sender_name", "text", "media_type")[:settings.AGENTLOOP_GROUP_CONTEXT_MESSAGES])
    return [line(name, text, media) for name, text, media in reversed(newest)]


def line(sender_name: str, text: str, media_type: str = "") -> str:
    """One group message as a turn's input shows it ("Ana: [photo] look"), here and in
    flushing.merge: what an erasure looks for in the other members' turns
    (conversations.erasure)."""
    if media_type:
        text = f"[{media_type}] {text}".strip()
    return f"{sender_name or 'Someone'}: {text}"


def with_context(buffer: MessageBuffer, merged_input: str, now: datetime) -> str:
    """A group turn's input: the group's context before the burst addressed to the agent."""
    if not buffer.conversation.is_group:
        return merged_input
    lines = context_lines(buffer, now)
    if not lines:
        return merged_input
    return "\n".join([CONTEXT_HEADER, *lines, ADDRESSED_HEADER, merged_input])
