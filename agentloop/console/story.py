"""A conversation's whole story, in time order, for the person asking "why did the bot
do that?": each admitted message and the window it got, each flush and its reason, each
turn (with the double-texting decisions around it), each guarded tool call (claim,
caught duplicate, proposal and who decided it), each ledger row and the audit events.

It reads every app's tables, so it lives here, above them (nothing imports it but the
console's views). One page is at most PAGE_SIZE entries, newest page first; each source
is asked for at most PAGE_SIZE rows older than the cursor, so a page costs one query per
source whatever the length of the conversation. Every text shown passes through
`redact`, with the channel's own secrets added.

What is not stored, and therefore not shown: a duplicate delivery refused by the inbound
dedup (the unique constraint refuses it and the webhook answers `duplicate: true`; no row
or event is written per delivery), the tools a model was offered and its read-only or
unguarded calls (only guarded calls leave a claim), and each send attempt of a ledger row
(the row keeps its count, its last outcome and last error).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils.dateparse import parse_datetime
from django.utils.text import capfirst
from django.utils.translation import gettext as _

# How a page is handed out (as_dict, as_json) lives in story_page; these names stay here for callers.
from agentloop.console.story_page import NOT_RECORDED, _iso, admin_url, as_dict, as_json  # noqa: F401
from agentloop.core.people import person_of
from agentloop.core.redaction import channel_secrets, redact, redact_payload
from audit.models import AuditEvent, EventKind
from conversations import windows
from conversations.media import for_agents
from conversations.models import (
    BufferState,
    ContextNote,
    Conversation,
    Disposition,
    InboundMessage,
    InboundReaction,
    MessageBuffer,
    MessageEdit,
    Turn,
)
from delivery import attachments
from delivery.models import OutboundMessage
from tools.models import ActionClaim

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

Row = TypeVar("Row", bound="Model")  # a source's rows

PAGE_SIZE = 200
TEXT_LIMIT = 2000  # a merged input or reply longer than this is cut on the page (the admin has it whole)
# The double-texting decisions the ingest audits (enqueue, the default, leaves no event).
DOUBLE_TEXTING = {EventKind.MESSAGE_REJECTED, EventKind.TURN_INTERRUPTED, EventKind.TURN_ROLLED_BACK,
                  EventKind.STRATEGY_FELL_BACK}


@dataclass
class Entry:
    at: datetime
    rank: int  # the source's place among entries of the same instant
    pk: int
    kind: str
    title: str
    text: str = ""
    details: list[tuple[str, Any]] = field(default_factory=list)  # (label, value) pairs
    links: list[tuple[str, str, Any]] = field(default_factory=list)  # (label, admin model, pk)
    by: str = ""  # a person's reply (a turn, a ledger row): who wrote it
    started: datetime | None = None  # a turn's run
    finished: datetime | None = None

    @property
    def key(self) -> tuple[datetime, int, int]:
        return (self.at, self.rank, self.pk)

    def cursor(self) -> str:
        return f"{self.at.isoformat()}~{self.rank}~{self.pk}"


@dataclass
class Page:
    conversation: Conversation
    entries: list[Entry]  # oldest first
    earlier: str | None  # the cursor of the page before this one, if any
    newest: bool


def parse_cursor(value: str | None) -> tuple[datetime, int, int] | None:
    """(time, rank, pk) from a cursor, or None for the newest page (or a mangled cursor)."""
    try:
        stamp, rank, pk = (value or "").split("~")
        at = parse_datetime(stamp)
        return (at, int(rank), int(pk)) if at else None
    except ValueError:
        return None


def page(conversation_id: int, before: str | None = None, size: int = PAGE_SIZE) -> Page:
    """The `size` entries just older than `before` (a cursor), oldest first."""
    conversation = Conversation.objects.select_related("channel", "contact").get(pk=conversation_id)
    cursor = parse_cursor(before)
    story = _Story(conversation, size)
    entries: list[Entry] = []
    for rank, (source, time_field) in enumerate(SOURCES):
        entries += source(story, _older(cursor, rank, time_field), rank)
    entries.sort(key=lambda e: e.key, reverse=True)
    shown = sorted(entries[:size], key=lambda e: e.key)
    story.annotate(shown)
    earlier = shown[0].cursor() if len(entries) > size else None
    return Page(conversation, shown, earlier, cursor is None)


def _older(cursor: tuple[datetime, int, int] | None, rank: int, time_field: str) -> Q:
    """Rows of the source with this rank that sort before the cursor (time, rank, pk)."""
    if cursor is None:
        return Q()
    at, cursor_rank, pk = cursor
    if rank < cursor_rank:
        return Q(**{f"{time_field}__lte": at})
    if rank == cursor_rank:
        return Q(**{f"{time_field}__lt": at}) | Q(**{time_field: at, "pk__lt": pk})
    return Q(**{f"{time_field}__lt": at})


class _Story:
    """One page's reading of one conversation: its secrets and its channel's settings."""

    def __init__(self, conversation: Conversation, size: int) -> None:
        self.conversation = conversation
        self.size = size
        self.secrets = channel_secrets(conversation.channel)
        self.settings = conversation.channel.debounce_settings()

    def redact(self, text: str, limit: int = TEXT_LIMIT) -> str:
        text = redact(text, self.secrets)
        return text if len(text) <= limit else text[:limit] + "…"

    def latest(self, queryset: QuerySet[Row], time_field: str, condition: Q) -> list[Row]:
        return list(queryset.filter(condition).order_by(f"-{time_field}", "-pk")[:self.size])

    def annotate(self, entries: list[Entry]) -> None:
        """What one entry says about another on the same page: a message that arrived
        while a turn ran."""
        running = [(e.started, e.finished, e.pk) for e in entries if e.kind == "turn" and e.started]
        for entry in entries:
            if entry.kind != "message":
                continue
            during = [pk for start, end, pk in running if start <= entry.at and (end is None or entry.at < end)]
            if during:
                entry.details.append((_("Double texting"), f"arrived while turn {during[0]} ran; channel strategy "
                                                         f"{self.conversation.channel.double_texting}"))


def _seconds(start: datetime | None, end: datetime | None) -> str:
    return f"{(end - start).total_seconds():.3f} s" if start and end else "—"


# --- the sources, each one query --------------------------------------------------------------


def _messages(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(InboundMessage.objects.filter(conversation=story.conversation)
                        .select_related("buffer", "media_file"), "received_at", older)
    return [_message_entry(story, m, rank) for m in rows]


def _message_entry(story: _Story, m: InboundMessage, rank: int) -> Entry:
    details: list[tuple[str, Any]] = [(_("Platform id"), m.platform_message_id), (_("Kind"), m.get_kind_display()),
               (_("Disposition"), m.get_disposition_display())]
    if m.sender_name:
        details.append((_("Sender"), story.redact(m.sender_name, 200)))
    if m.sent_at:
        details.append((_("Sent by the platform"), f"{_iso(m.sent_at)} (admitted {_seconds(m.sent_at, m.received_at)} "
                                                f"later)"))
    if m.edited_at:
        details.append((_("Edited"), f"last at {_iso(m.edited_at)}: the text shown is the corrected one (each edit, "
                                  f"with the text before it, is an entry of its own)"))
    if m.deleted_at:
        details.append((_("Deleted"), f"by the person at {_iso(m.deleted_at)}: kept out of every later prompt "
                                   f"(what it changed is in the audit's message_deleted event)"))
    if m.buffer is not None and m.disposition == Disposition.BUFFERED:  # select_related: no query
        details.append((_("Window"), _window(story, m, m.buffer)))
    links: list[tuple[str, str, Any]] = [("message", "conversations.inboundmessage", m.pk)]
    if m.buffer_id:
        links.append((f"buffer {m.buffer_id}", "conversations.messagebuffer", m.buffer_id))
    if m.media_file is not None:  # what the agent was shown of it (or why not), and the file in the admin
        details.append((_("File"), story.redact(for_agents.describe(for_agents.attachment_of(m.media_file)), 400)))
        links.append((f"file {m.media_file_id}", "conversations.mediafile", m.media_file_id))
    text = f"[{m.media_type}] {m.text}" if m.media_type else m.text
    who = m.sender_name or _("the contact")
    title = (_("Message admitted from %(who)s (deleted)") if m.deleted_at else _("Message admitted from %(who)s")) % {
        "who": who}
    if _is_command(m):  # /help, /stop…: answered by agentloop, never buffered
        details[2] = (_("Disposition"), Disposition.CONTROL.label)
        title = _("Control command %(command)s from %(who)s") % {
            "command": story.redact(m.text.split()[0] if m.text.split() else m.text, 40),
            "who": m.sender_name or _("the contact")}
    return Entry(m.received_at, rank, m.pk, "message", title,
                 story.redact(text), details, links)


def _is_command(m: InboundMessage) -> bool:
    """A control command or a confirmation's answer. The ingest stores a command's row as
    "buffered" with no buffer (conversations.ingest.admission): without a buffer, a
    buffered message that starts with "/" can only be a command."""
    return m.disposition == Disposition.CONTROL or (
        m.disposition == Disposition.BUFFERED and not m.buffer_id and m.text.startswith("/"))


def _window(story: _Story, m: InboundMessage, buffer: MessageBuffer) -> str:
    """The window this message got. The buffer stores the window of its last message;
    for the earlier ones it is recomputed from the text with the channel's settings."""
    if buffer.last_message_at == m.received_at and buffer.window_kind:
        return (f"{buffer.window_kind}, {buffer.window_seconds:g} s (stored on buffer {buffer.pk}); "
                f"planned flush: {buffer.get_planned_reason_display()} at {_iso(buffer.flush_at)}")
    if m.media_type and story.settings.media_at_once:
        return "media: flushes at once (the channel's choice)"
    kind = windows.MEDIA if m.media_type and not m.text.strip() else windows.classify(m.text, story.settings)
    return (f"{kind}, {story.settings.seconds(kind):g} s — re-armed by a later message (recomputed from the text "
            f"with the channel's current settings)")


def _buffers(story: _Story, older: Q, rank: int) -> list[Entry]:
    # An open buffer has no flush yet: it stands at its last message.
    rows = story.latest(MessageBuffer.objects.filter(conversation=story.conversation)
                        .annotate(story_at=Coalesce("flushed_at", "last_message_at")), "story_at", older)
    return [_buffer_entry(story, b, rank) for b in rows]


def _buffer_entry(story: _Story, b: MessageBuffer, rank: int) -> Entry:
    details = [(_("Messages"), b.message_count), (_("First message"), _iso(b.first_message_at)),
               (_("Last message"), _iso(b.last_message_at)),
               (_("Last window"), f"{b.window_kind or '—'}, {b.window_seconds:g} s"),
               (_("Deadline"), _iso(b.flush_at))]
    if b.state == BufferState.OPEN:
        title = _("Buffer open: flushes at %(at)s (%(reason)s)") % {"at": _iso(b.flush_at),
                                                                    "reason": b.get_planned_reason_display()}
    elif b.state == BufferState.FLUSHED:
        title = _("Buffer flushed: %(reason)s") % {"reason": b.get_flush_reason_display() or b.flush_reason}
        details += [(_("Waited"), f"{_seconds(b.first_message_at, b.flushed_at)} after the first message, "
                               f"{_seconds(b.last_message_at, b.flushed_at)} after the last"),
                    (_("Flushed by"), b.flushed_by or "—")]
    else:
        title = _("Buffer dropped (/stop or /reset)")
    if b.carried_turn_id:
        details.append((_("Carries"), f"the input of cancelled turn {b.carried_turn_id} (interrupt)"))
    return Entry(b.story_at, rank, b.pk, "buffer", title, "", details,  # type: ignore[attr-defined]  # annotated
                 [(f"buffer {b.pk}", "conversations.messagebuffer", b.pk)])


def _turns(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(Turn.objects.filter(conversation=story.conversation), "created_at", older)
    return [_turn_entry(story, t, rank) for t in rows]


def _turn_entry(story: _Story, t: Turn, rank: int) -> Entry:
    details = [(_("State"), t.get_state_display()), (_("Flush reason"), t.get_flush_reason_display()),
               (_("Started"), f"{_iso(t.started_at)} (waited {_seconds(t.created_at, t.started_at)})"),
               (_("Finished"), f"{_iso(t.finished_at)} (ran {_seconds(t.started_at, t.finished_at)})"),
               (_("Worker"), t.owner or "—"), (_("Attempts"), t.attempts),
               (_("Fired an effect"), f"yes, at {_iso(t.effect_fired_at)} (never interrupted after)"
                if t.fired_effect else "no")]
    if t.route:  # a routing rule's agent answered, or the one an agent handed over to (docs/routing.md)
        details.append((_("Routed"), t.route))
    if t.outcome:
        details.append((_("Outcome"), story.redact(t.outcome, 300)))
    if t.first_delta_at:  # a streamed reply (docs/streaming.md)
        details.append((_("Streamed"), f"first delta at {_iso(t.first_delta_at)} "
                                    f"({_seconds(t.started_at, t.first_delta_at)} after it started); "
                                    f"{t.previews} preview{'' if t.previews == 1 else 's'} shown"
                                    + (f"; preview message {t.preview_message_id}" if t.preview_message_id else "")))
    if t.reply_text:
        details.append((_("Reply"), story.redact(t.reply_text)))
    links = [(f"turn {t.pk}", "conversations.turn", t.pk)]
    if t.buffer_id:
        links.append((f"buffer {t.buffer_id}", "conversations.messagebuffer", t.buffer_id))
    person = person_of(t.owner)  # a person's reply is a turn too (conversations.handoff): say who
    title = _("Reply by %(person)s") % {"person": person} if person else _("Turn %(id)s: %(state)s") % {
        "id": t.pk, "state": t.get_state_display()}
    entry = Entry(t.created_at, rank, t.pk, "turn", title, story.redact(t.merged_input), details, links)
    entry.by = person
    entry.started, entry.finished = t.started_at, t.finished_at
    return entry


def _claims(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(ActionClaim.objects.filter(conversation_id=story.conversation.pk)
                        .select_related("proposal"), "created_at", older)
    return [_claim_entry(story, c, rank) for c in rows]


def _claim_entry(story: _Story, c: ActionClaim, rank: int) -> Entry:
    details = [(_("State"), c.get_state_display()), (_("Claimed by"), c.owner or "—"),
               (_("Fingerprint"), f"{c.fingerprint[:12]}… of {', '.join(c.fingerprint_fields) or 'all arguments'}"),
               (_("Arguments"), _json(story, c.arguments)),
               (_("Window ends"), _iso(c.expires_at)),
               (_("Finished"), f"{_iso(c.finished_at)} ({_seconds(c.created_at, c.finished_at)})")]
    if c.result is not None:
        details.append((_("Result"), _json(story, c.result)))
    if c.error:
        details.append((_("Error"), story.redact(c.error, 300)))
    if c.duplicates_caught:
        details.append((_("Duplicates caught"), f"{c.duplicates_caught} (this claim is their original)"))
    links = [(f"claim {c.pk}", "tools.actionclaim", c.pk)]
    proposal = getattr(c, "proposal", None)  # select_related: no query
    if proposal is not None:
        decided = (f"{proposal.get_state_display()} by {proposal.decided_by} at {_iso(proposal.decided_at)}"
                   if proposal.decided_by else f"{proposal.get_state_display()} (expires {_iso(proposal.expires_at)})")
        details.append((_("Proposal"), decided))
        if proposal.error:
            details.append((_("Proposal error"), story.redact(proposal.error, 300)))
        links.append((f"proposal {proposal.pk}", "tools.proposal", proposal.pk))
    title = (_("Guard: %(tool)s claimed") if proposal is None else _("Guard: %(tool)s proposed for approval")) % {
        "tool": c.action}
    return Entry(c.created_at, rank, c.pk, "claim", title, "", details, links)


def _json(story: _Story, value: Any) -> str:
    return story.redact(json.dumps(redact_payload(value), ensure_ascii=False, default=str), 600)


def _ledger(story: _Story, older: Q, rank: int) -> list[Entry]:
    # The turn's stream facts come with the row (one query still): which send was the final.
    rows = story.latest(OutboundMessage.objects.filter(conversation=story.conversation).annotate(
        turn_previews=F("turn__previews"), turn_preview=F("turn__preview_message_id"), turn_owner=F("turn__owner")),
        "created_at", older)
    return [_ledger_entry(story, r, rank) for r in rows]


def _ledger_entry(story: _Story, r: OutboundMessage, rank: int) -> Entry:
    details = [(_("State"), r.get_state_display()),
               (_("Attempts"), f"{r.attempts} (flood waits {r.flood_waits}, operator resends {r.extra_resends})"),
               (_("Last outcome"), r.get_last_outcome_display() or "—"),
               (_("Recovery marker"), "yes: the latest attempt carried '♻️ Recovered reply'"
                if r.needs_marker else "no"),
               (_("Last claimed"), _iso(r.claimed_at)),
               (_("Delivered"), f"{_iso(r.delivered_at)} ({_seconds(r.created_at, r.delivered_at)} after written)"),
               (_("Platform message id"), r.platform_message_id or "—")]
    if r.last_error:
        details.append((_("Last error"), story.redact(r.last_error, 300)))
    final = _final_of_stream(r)
    if final:
        details.append((_("Final of a stream"), final))
    files = attachments.listed(r.chunks)
    if files:  # sent after the text, each a chunk of the row
        details.append((_("Files"), "; ".join(files)))
    if r.next_attempt_at and r.state in OutboundMessage.OPEN:
        details.append((_("Next attempt"), _iso(r.next_attempt_at)))
    links = [(f"ledger row {r.pk}", "delivery.outboundmessage", r.pk)]
    if r.turn_id:
        links.append((f"turn {r.turn_id}", "conversations.turn", r.turn_id))
    person = person_of(getattr(r, "turn_owner", "") or "")
    title = (_("Ledger: reply by %(person)s written, %(state)s") % {"person": person, "state": r.get_state_display()}
             if person else _("Ledger: %(kind)s written, %(state)s") % {"kind": r.get_kind_display(),
                                                                        "state": r.get_state_display()})
    entry = Entry(r.created_at, rank, r.pk, "ledger", title, story.redact(r.text), details, links)
    entry.by = person
    return entry


def _final_of_stream(r: OutboundMessage) -> str:
    """Which send was a streamed reply's final: the ledger's edit of the group's preview
    message, or a new message (after drafts; or the preview deleted or marked stale)."""
    previews, preview = getattr(r, "turn_previews", 0) or 0, getattr(r, "turn_preview", "") or ""
    if not (previews or preview or r.preview_message_id) or r.kind not in ("reply", "notice"):
        return ""
    if r.platform_message_id and r.platform_message_id in (r.preview_message_id, preview):
        return f"the edit of preview message {r.platform_message_id} (after {previews} previews)"
    if r.preview_message_id:
        return f"to be the edit of preview message {r.preview_message_id}"
    if preview:
        return (f"a new message {r.platform_message_id or '(not yet sent)'}; the stale preview message "
                f"{preview} was deleted or marked")
    return f"a new message {r.platform_message_id or '(not yet sent)'}, after {previews} drafts"


def _events(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(AuditEvent.objects.filter(conversation_id=story.conversation.pk), "at", older)
    return [_event_entry(story, e, rank) for e in rows]


def _event_entry(story: _Story, e: AuditEvent, rank: int) -> Entry:
    extra = e.extra or {}
    details = [(_("Actor"), story.redact(e.actor, 100) or "—"), (_("Target"), e.target or "—")]
    details += [(name, _json(story, value) if isinstance(value, (dict, list)) else story.redact(str(value), 300))
                for name, value in sorted(extra.items())]
    links = [(f"event {e.pk}", "audit.auditevent", e.pk)]
    if extra.get("original_claim"):
        links.append((f"original: claim {extra['original_claim']}", "tools.actionclaim", extra["original_claim"]))
    kind = "double_texting" if e.kind in DOUBLE_TEXTING else "audit"
    label = EventKind(e.kind).label if e.kind in EventKind.values else e.kind
    text = story.redact(e.summary, 300)
    if extra.get("tool"):  # its summary is as the guard wrote it (English): the tool on the line, the summary inside
        details.insert(0, (str(capfirst(AuditEvent._meta.get_field("summary").verbose_name)), text))
        text = str(extra["tool"])
    return Entry(e.at, rank, e.pk, kind, _("Audit: %(event)s") % {"event": label}, text, details, links)


def _notes(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(ContextNote.objects.filter(conversation=story.conversation), "created_at", older)
    return [Entry(n.created_at, rank, n.pk, "note", _("Note for the agent's next turn"), story.redact(n.text), [],
                  [(f"note {n.pk}", "conversations.contextnote", n.pk)]) for n in rows]


def _edits(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(MessageEdit.objects.filter(conversation=story.conversation), "received_at", older)
    return [_edit_entry(story, e, rank) for e in rows]


def _edit_entry(story: _Story, e: MessageEdit, rank: int) -> Entry:
    details = [(_("Outcome"), e.get_outcome_display()), (_("Why"), story.redact(e.detail, 300) or "—"),
               (_("Edited by the user"), f"{_iso(e.edited_at)} (via {e.source})"),
               (_("Text before"), story.redact(e.old_text))]
    links = [(f"message {e.message_id}", "conversations.inboundmessage", e.message_id)]
    if e.turn_id:
        links.append((f"turn {e.turn_id}", "conversations.turn", e.turn_id))
    return Entry(e.received_at, rank, e.pk, "edit", _("Message %(id)s edited: %(outcome)s") % {
                     "id": e.message_id, "outcome": e.get_outcome_display()},
                 story.redact(e.new_text), details, links)


def _reactions(story: _Story, older: Q, rank: int) -> list[Entry]:
    rows = story.latest(InboundReaction.objects.filter(conversation=story.conversation), "reacted_at", older)
    return [Entry(r.reacted_at, rank, r.pk, "reaction",
                  _("Reaction %(emoji)s on the bot's message: %(outcome)s") % {
                      "emoji": r.emoji or _("(taken back)"), "outcome": r.get_outcome_display()}, "",
                  [(_("By"), story.redact(r.sender_id, 100)), (_("Message"), r.platform_message_id), (_("Event"), r.key)], [])
            for r in rows]


# In this order within the same instant: what arrived, what it flushed, what ran, what it did
# (edits, then reactions, last: a source's rank is part of the page cursor).
# Each with the time field its rows are ordered and paged by.
SOURCES: list[tuple[Callable[[_Story, Q, int], list[Entry]], str]] = [
    (_messages, "received_at"), (_buffers, "story_at"), (_turns, "created_at"), (_claims, "created_at"),
    (_ledger, "created_at"), (_events, "at"), (_notes, "created_at"), (_edits, "received_at"),
    (_reactions, "reacted_at")]

