"""A conversation's recording, exported from its rows: what came in, with its timing,
and what the product made of it (agentloop.console.replay.document says the shape).

What came in: each message (text, media type, album, whether it was a control command),
each edit, each deletion and each tap (a reaction standing for an answer button), at
its offset in milliseconds from the first message. What happened: each turn with the
messages its buffer merged, the flush reason, its input, reply, tokens and latency, the
guarded tool calls made while it ran with what the guard made of each, and the ledger's
rows with their outcome and whether they went out labelled. Every text passes through
`redact` (a secret never leaves in a recording); `mask` also replaces personal data.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from agentloop.console.replay import document
from agentloop.console.replay.document import Document, RecordingError
from agentloop.console.replay.masking import Masker
from agentloop.core.redaction import channel_secrets, redact, redact_payload
from audit.models import AuditEvent, EventKind
from conversations.models import (
    Conversation,
    InboundMessage,
    InboundReaction,
    MediaFile,
    MessageEdit,
    MessageKind,
    Turn,
)
from delivery.models import OutboundMessage
from tools.models import ActionClaim, ClaimState

# What the guard made of a call, by the state its claim ended in (a caught duplicate is an audit event).
GUARD_OUTCOMES: dict[str, str] = {ClaimState.DONE: "executed", ClaimState.PROPOSED: "proposed", ClaimState.RELEASED: "failed",
                  ClaimState.UNCERTAIN: "uncertain", ClaimState.IN_FLIGHT: "in_flight"}


def export(conversation_id: int, *, mask: bool = False) -> Document:
    """The recording of a conversation (RecordingError when there is none with this id)."""
    conversation = Conversation.objects.select_related("channel", "contact").filter(pk=conversation_id).first()
    if conversation is None:
        raise RecordingError(f"no conversation {conversation_id}")
    messages = list(InboundMessage.objects.filter(conversation=conversation).select_related("media_file")
                    .order_by("received_at", "pk"))
    if not messages:
        raise RecordingError(f"conversation {conversation_id} has no message to record")
    return _Export(conversation, messages, Masker(mask)).document()


def happened(conversation: Conversation, calls: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """What happened in a replayed conversation, in a recording's terms: its tool calls as
    the replay saw them (`calls`, by turn id: the guard's claims are stamped with the
    wall clock, the replay's turns with its virtual one)."""
    messages = list(InboundMessage.objects.filter(conversation=conversation).order_by("received_at", "pk"))
    exported = _Export(conversation, messages, Masker(False), calls)
    return {"turns": [exported.turn(index, turn) for index, turn in enumerate(exported.turns)],
            "replies": exported.replies()}


def _ms(start: datetime, at: datetime | None) -> int:
    return max(0, round((at - start).total_seconds() * 1000)) if at else 0


class _Export:
    def __init__(self, conversation: Conversation, messages: list[InboundMessage], masker: Masker,
                 calls: dict[int, list[dict[str, Any]]] | None = None) -> None:
        self.conversation, self.messages, self.masker, self.calls = conversation, messages, masker, calls
        self.start = messages[0].received_at if messages else timezone.now()
        self.secrets = channel_secrets(conversation.channel)
        self.turns = list(Turn.objects.filter(conversation=conversation).order_by("created_at", "pk"))
        # Stand-ins for the people first, so their names are masked in every text after.
        self.masker.stand_in("person", conversation.contact.display_name)
        for message in messages:
            self.masker.stand_in("person", message.sender_name)

    def text(self, value: str) -> str:
        return self.masker.text(redact(value, self.secrets))

    def message_id(self, platform_id: str) -> str:
        return self.masker.stand_in("message", platform_id)

    def document(self) -> Document:
        channel, masked = self.conversation.channel, self.masker.enabled
        recording: Document = {
            "format": document.FORMAT, "version": document.VERSION,
            "exported_at": timezone.now().isoformat(), "masked": masked,
            "conversation": {
                "id": None if masked else self.conversation.pk, "channel": channel.slug, "kind": channel.kind,
                "is_group": self.conversation.is_group, "language": self.conversation.language,
                "chat": self.masker.stand_in("chat", self.conversation.chat_id),
                "sender": self.masker.stand_in("sender", self.conversation.sender_id),
                "contact": self.masker.stand_in("person", self.conversation.contact.display_name),
                "started_at": None if masked else self.start.isoformat(),
            },
            "settings": {name: getattr(channel, name) for name in document.SETTINGS},
            "events": self.events(),
            "happened": {"turns": [self.turn(index, turn) for index, turn in enumerate(self.turns)],
                         "replies": self.replies()},
        }
        recording["settings"]["agent_config"] = redact_payload(channel.agent_config)
        return recording

    # --- what came in -------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        events = [self.message(m) for m in self.messages]
        events += [{"at_ms": _ms(self.start, e.received_at), "type": "edit",
                    "of": self.message_id(e.message.platform_message_id), "text": self.text(e.new_text)}
                   for e in MessageEdit.objects.filter(conversation=self.conversation).select_related("message")]
        events += [{"at_ms": _ms(self.start, m.deleted_at), "type": "delete", "of": self.message_id(m.platform_message_id)}
                   for m in self.messages if m.deleted_at]
        events += [{"at_ms": _ms(self.start, r.reacted_at), "type": "tap", "of": self.masker.stand_in(
                    "reply", r.platform_message_id), "emoji": r.emoji, "outcome": r.outcome}
                   for r in InboundReaction.objects.filter(conversation=self.conversation).order_by("reacted_at", "pk")]
        return sorted(events, key=lambda e: e["at_ms"])

    def message(self, m: InboundMessage) -> dict[str, Any]:
        # Its text as it first came: an edit is an event of its own, later.
        first = MessageEdit.objects.filter(message=m).order_by("received_at", "pk").values_list("old_text", flat=True)
        text = next(iter(first), m.text)
        return {"at_ms": _ms(self.start, m.received_at), "type": "message", "id": self.message_id(m.platform_message_id),
                "text": self.text(text), "control": m.kind == MessageKind.CONTROL, "media_type": m.media_type,
                "album": self.masker.stand_in("album", m.album_id), "media": self.media(m.media_file),
                "sender": self.masker.stand_in("sender", self.conversation.sender_id),
                "sender_name": self.masker.stand_in("person", m.sender_name), "disposition": m.disposition}

    def media(self, file: MediaFile | None) -> dict[str, Any] | None:
        """The file a message carried, as a reference (a replay fetches no file: its type gives its window)."""
        if file is None:
            return None
        return {"key": self.masker.stand_in("file", file.file_key), "kind": file.kind,
                "type": file.content_type or file.declared_type, "name": self.masker.stand_in("file-name", file.file_name),
                "size": file.size or file.declared_size, "duration": file.duration}

    # --- what happened ------------------------------------------------------------------

    def turn(self, index: int, turn: Turn) -> dict[str, Any]:
        merged = InboundMessage.objects.filter(buffer_id=turn.buffer_id).order_by("received_at", "pk") \
            if turn.buffer_id else InboundMessage.objects.none()
        latency = (turn.finished_at - turn.started_at).total_seconds() if turn.finished_at and turn.started_at else None
        return {"index": index, "at_ms": _ms(self.start, turn.created_at), "flush_reason": turn.flush_reason,
                "messages": [self.message_id(pid) for pid in merged.values_list("platform_message_id", flat=True)],
                "input": self.text(turn.merged_input), "state": turn.state, "reply": self.text(turn.reply_text),
                "outcome": self.text(turn.outcome), "tokens": turn.tokens_used,
                "latency_ms": round(latency * 1000) if latency is not None else None,
                "tools": self.tool_calls(index, turn)}

    def tool_calls(self, index: int, turn: Turn) -> list[dict[str, Any]]:
        """The guarded calls made while this turn ran (claims and caught duplicates carry
        the conversation, not the turn: the turn is the one running at the time)."""
        if self.calls is not None:
            return self.calls.get(turn.pk, [])
        begin, end = turn.started_at, turn.finished_at or self.next_start(index)
        if begin is None:
            return []
        claims = ActionClaim.objects.filter(conversation_id=self.conversation.pk, created_at__gte=begin)
        duplicates = AuditEvent.objects.filter(conversation_id=self.conversation.pk, kind=EventKind.DUPLICATE_PREVENTED,
                                               at__gte=begin)
        if end is not None:
            claims, duplicates = claims.filter(created_at__lte=end), duplicates.filter(at__lte=end)
        calls = [(c.created_at, c.pk, {"tool": c.action, "arguments": self.arguments(c.arguments),
                                       "guard": GUARD_OUTCOMES.get(c.state, c.state)}) for c in claims]
        originals = {c.pk: c for c in ActionClaim.objects.filter(
            pk__in=[d.extra.get("original_claim") for d in duplicates])}
        for event in duplicates:
            original = originals.get(event.extra.get("original_claim"))
            calls.append((event.at, event.pk, {"tool": event.extra.get("tool", ""), "guard": "duplicate_prevented",
                                               "arguments": self.arguments(original.arguments if original else {})}))
        return [call for _, _, call in sorted(calls, key=lambda item: (item[0], item[1]))]

    def next_start(self, index: int) -> datetime | None:
        later = [t.started_at for t in self.turns[index + 1:] if t.started_at]
        return later[0] if later else None

    def arguments(self, arguments: Any) -> Any:
        if isinstance(arguments, dict):
            return {key: self.arguments(value) for key, value in arguments.items()}
        return self.text(arguments) if isinstance(arguments, str) else arguments

    def replies(self) -> list[dict[str, Any]]:
        turn_index = {turn.pk: index for index, turn in enumerate(self.turns)}
        rows = OutboundMessage.objects.filter(conversation=self.conversation).order_by("created_at", "pk")
        return [{"turn": turn_index.get(row.turn_id) if row.turn_id else None, "kind": row.kind,
                 "text": self.text(row.text), "state": row.state, "outcome": row.last_outcome,
                 "labelled": row.needs_marker} for row in rows]
