"""The copies of a person's data outside their own conversations' rows, found and erased
with them (conversations.erasure, docs/operations.md#erasure):

- in a group, each of their messages is copied as a line ("Name: text", groups.line)
  into the input of the other members' turns (the group's context), and from there into
  what the agent answered them (streamed text, reply, its ledger row): each such line
  becomes "[erased]", the other members' own lines stay as they were;
- the stored bytes of files replies carried to them (delivery.attachments), deleted once
  the erasure commits unless another ledger row names the same object;
- audit events written where no conversation existed: a refused message and an ignored
  edit name them as their actor and their chat in the target, a lifted limit names them
  in its target;
- the unreachable mark and the pacing slot of their private chats (both keyed by its id);
- the admin's log entries of their rows (Django writes each row's name into it).

`Copies.of` reads what the copies look like before their rows are scrubbed.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import CharField, Q
from django.db.models.functions import Cast

from audit.models import AuditEvent
from conversations import groups
from conversations.ingest.refusal import printable
from conversations.models import Contact, ContextNote, Conversation, InboundMessage, MessageEdit, Turn
from delivery import attachments
from delivery.ledger.sweeps import delete_unnamed_files
from delivery.models import OutboundMessage, ScheduledMessage, SendBudget, UnreachableChat

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

ERASED = "[erased]"
# flushing.clip's mark, first in a turn's input cut to AGENTLOOP_MAX_TURN_CHARS: the line
# after it may be the end of one of the person's lines.
CUT = re.compile(r"\[… \d+ characters cut\]\n")
# Hosts' clocks differ: a copy is looked for from this long before the person's first
# message in the chat (a turn is made after the messages it copies).
CLOCK_SKEW = timedelta(hours=1)
# What the agent's turns and the ledger hold of a group's lines.
COPIED_INTO = ((Turn, ("merged_input", "streamed_text", "reply_text")), (OutboundMessage, ("text", "chunks")))


@dataclass
class Copies:
    contact: Contact
    conversations: list[int]
    private_chats: list[str]  # the chat ids of their one-to-one conversations
    group_lines: dict[str, set[str]]  # a group's chat id: their lines there, as turns show them
    first_in_group: dict[str, datetime]  # a group's chat id: when their first message there came

    @classmethod
    def of(cls, contact: Contact, conversations: Collection[int]) -> Copies:
        private = list(Conversation.objects.filter(pk__in=conversations, is_group=False)
                       .values_list("chat_id", flat=True))
        lines: dict[str, set[str]] = {}
        first: dict[str, datetime] = {}
        in_groups = Q(conversation_id__in=conversations, conversation__is_group=True)
        for chat, name, text, media, at in InboundMessage.objects.filter(in_groups).values_list(
                "conversation__chat_id", "sender_name", "text", "media_type", "received_at").iterator():
            lines.setdefault(chat, set()).add(groups.line(name, text, media))
            first[chat] = min(first.get(chat, at), at)
        # A turn made before an edit shows the text as it was.
        for chat, name, media, old, new in MessageEdit.objects.filter(in_groups).values_list(
                "conversation__chat_id", "message__sender_name", "message__media_type", "old_text", "new_text"):
            lines.setdefault(chat, set()).update({groups.line(name, old, media), groups.line(name, new, media)})
        return cls(contact, list(conversations), private, lines, first)

    def forget_admin_log(self) -> int:
        """The admin's log entries of their rows keep the rows' ids, not their names."""
        rows: dict[type[Model], QuerySet[Any]] = {Contact: Contact.objects.filter(pk=self.contact.pk),
                Conversation: Conversation.objects.filter(pk__in=self.conversations)}
        mine = Q(conversation_id__in=self.conversations)
        for model in (InboundMessage, Turn, ContextNote, OutboundMessage, ScheduledMessage):
            rows[model] = model.objects.filter(mine)
        named = Q()
        for kind, found in rows.items():
            named |= Q(content_type=ContentType.objects.get_for_model(kind),
                       object_id__in=found.annotate(key=Cast("pk", CharField())).values("key"))
        return LogEntry.objects.filter(named).update(object_repr=ERASED, change_message="")

    def forget_reply_files_on_commit(self) -> None:
        """Called before their ledger rows are deleted, in the erasure's transaction."""
        names: set[str] = set()
        for pieces in OutboundMessage.objects.filter(conversation_id__in=self.conversations).values_list(
                "chunks", flat=True).iterator():
            names |= attachments.stored_names(pieces)
        if names:
            transaction.on_commit(lambda: delete_unnamed_files(names))

    def erase(self) -> dict[str, int]:
        """Erase the copies; their counts for the erasure's audit event."""
        return {"lines_elsewhere": self._erase_group_lines(), "ids_elsewhere": self._erase_ids()}

    def _erase_group_lines(self) -> int:
        changed = 0
        for chat, lines in self.group_lines.items():
            others = (Q(conversation__channel_id=self.contact.channel_id, conversation__chat_id=chat,
                        created_at__gte=self.first_in_group[chat] - CLOCK_SKEW)
                      & ~Q(conversation_id__in=self.conversations))
            for model, fields in COPIED_INTO:
                for row in model.objects.filter(others).values("pk", *fields).iterator():
                    erased = {name: without(row[name], lines) for name in fields}
                    if any(erased[name] != row[name] for name in fields):
                        changed += model.objects.filter(pk=row["pk"]).update(**erased)
        return changed

    def _erase_ids(self) -> int:
        contact, channel = self.contact, self.contact.channel
        events = AuditEvent.objects.filter(channel_slug=channel.slug)
        erased = events.filter(actor=printable(contact.platform_id)).update(actor=ERASED, target="", summary=ERASED,
                                                                           extra={})
        erased += events.filter(target=f"contact {contact.platform_id}").update(target=ERASED)
        erased += UnreachableChat.objects.filter(channel_id=channel.pk, chat_id__in=self.private_chats).delete()[0]
        if self.private_chats:  # a pacing key is "<bot>:<chat>" (delivery.pacing.Pace)
            keys = Q()
            for chat in self.private_chats:
                keys |= Q(key__endswith=f":{chat}")
            erased += SendBudget.objects.filter(keys).delete()[0]
        return erased


def without(value: Any, lines: Collection[str]) -> Any:  # a text, or a JSON list of chunks: the same back
    """`value` (a text, or a ledger row's chunks) with each of `lines` that stands as a
    whole line in it replaced by ERASED."""
    if isinstance(value, list):
        return [without(piece, lines) if isinstance(piece, str) else piece for piece in value]
    if not value or not lines:
        return value
    cut = CUT.match(value)
    head, body = (value[:cut.end()], _without_cut_line(value[cut.end():], lines)) if cut else ("", value)
    for line in sorted(lines, key=len, reverse=True):  # a longer line holding a shorter one first
        if line in body:
            body = re.sub(rf"(?m)^{re.escape(line)}(?=\n|\Z)", ERASED, body)
    return head + _without_open_line(body, lines)


def _without_cut_line(body: str, lines: Collection[str]) -> str:
    """`body` (after a cut mark) with its first line erased when it is the end of one of
    `lines` (a line may span several: a message's own line breaks)."""
    for line in sorted(lines, key=len, reverse=True):
        ends = [at for at, char in enumerate(body[:len(line)]) if char == "\n"]
        if len(body) <= len(line):
            ends.append(len(body))
        for end in reversed(ends):
            if end and line.endswith(body[:end]):
                return ERASED + body[end:]
    return body


def _without_open_line(body: str, lines: Collection[str]) -> str:
    """`body` with its end erased when it is the start of one of `lines`: a streamed
    reply's text is saved as it grows (conversations.worker.streams), so the last snapshot
    may stop inside one of the person's lines."""
    starts = [0, *(at + 1 for at, char in enumerate(body) if char == "\n")]
    for start in starts:  # the earliest first: the longest open end
        tail = body[start:]
        if tail and tail != ERASED and any(line.startswith(tail) for line in lines):
            return body[:start] + ERASED
    return body
