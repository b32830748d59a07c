"""The flusher's database step: due buffers claimed and made into turns, in one
transaction each (a claimed buffer always has its turn). Split from
`conversations.engine`."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentloop.core import metrics, rows
from audit.failpoints import after_commit
from conversations import console, groups, liveness, routing, spans, sql, turns, windows
from conversations.models import (
    BufferState,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)

# A batch's messages, by the id of the buffer they are in, oldest first
# (conversations.sql.build_messages).
ByBuffer = dict[int | None, list[InboundMessage]]

log = logging.getLogger(__name__)


def due_buffer_ids(now: datetime, limit: int = 200) -> list[int]:
    """Open buffers whose deadline passed, oldest deadline first. A buffer whose
    conversation has a turn ready or running waits (enqueue): it flushes when that turn
    ends, so everything said meanwhile becomes one next turn."""
    return sql.due_buffer_ids(now, limit)


def next_deadline(now: datetime) -> datetime | None:
    """The nearest future deadline, or None."""
    return sql.next_deadline(now)


def look(now: datetime, limit: int = 200) -> tuple[list[int], datetime | None]:
    """The flusher's look: (due_buffer_ids, next_deadline) in one statement — one wait
    for the database per wake-up instead of two, on the flusher's timed path and in the
    idle floor every worker costs (20 looks a second)."""
    return sql.look(now, limit)


def flush_buffer(buffer_id: int, now: datetime | None = None) -> Turn | None:
    """Claim one due buffer and turn it into a READY turn; None when another process
    flushed it or a new message re-armed it."""
    flushed = flush_many([buffer_id], now or timezone.now())
    return flushed[0] if flushed else None


_batches = itertools.count(1)


def flush_many(buffer_ids: Iterable[int], now: datetime, owner: str = "", start: int = 0) -> list[Turn]:
    """Claim due buffers and make their turns, in one transaction: a claimed buffer
    always has its turn, a crash leaves it open.

    The claim is one compare-and-swap UPDATE for the whole batch, stamped with a
    token unique to this batch; reading the stamp back tells which buffers this
    call won (a buffer re-armed or flushed elsewhere meanwhile is not among them).

    `start`: how many of the new turns `owner` will run at once. Those are born
    RUNNING under it in this same transaction — when first in line in their
    conversation and not waiting for an external agent — so no second write stands
    between the deadline and the agent. The rest are born READY.

    On SQLite the turns are first worked out from the buffers as they are before the
    transaction (`_prepare`); inside it, what the claim won is compared with what was
    read, and the turns made then are used only where nothing differs."""
    token = f"{owner or liveness.new_owner()}#{next(_batches)}"
    ids = list(buffer_ids)
    prepared = _prepare(ids, now, owner, start, token)
    with transaction.atomic():
        claimed = sql.claim_rows(ids, now, token)
        if not claimed:
            return []
        message_rows = sql.message_rows(row[0] for row in claimed)
        if prepared is not None and prepared.holds(claimed, message_rows):
            new_turns, by_buffer, started = prepared.turns, prepared.by_buffer, prepared.started
            statement = prepared.statement
        else:
            new_turns, by_buffer = _turns_of(sql.build_buffers(claimed), sql.build_messages(message_rows),
                                             now, owner, start)
            if not new_turns:
                return []
            started, statement = spans.flushes(new_turns, by_buffer), None
        created = rows.create_many(Turn, new_turns, statement)
        spans.flushed(started, created)
        console.turns_created(created)
        metrics.after_commit(_count_flushes, [(t.flush_reason, len(by_buffer.get(t.buffer_id, ()))) for t in created])
        after_commit("flush.after_claim")
        return created


def _turns_of(buffers: list[MessageBuffer], by_buffer: ByBuffer, now: datetime, owner: str,
              start: int) -> tuple[list[Turn], ByBuffer]:
    """(the new turns, their messages by buffer) of claimed buffers. Writes what a
    batch needs beyond its turns: a group's unaddressed messages kept as context, and
    a buffer's messages past its channel's cap moved to a new buffer."""
    buffers, unaddressed = groups.split(buffers, by_buffer)
    groups.keep_as_context(unaddressed)
    _keep_the_rest_waiting(buffers, by_buffer, now)
    new_turns = [_turn_for(b, by_buffer.get(b.pk, []), now) for b in buffers]
    if start > 0:
        _born_running(new_turns, owner, now, start)
    return new_turns, by_buffer


class _Prepared:
    """A flush worked out before its transaction: the rows it read, the turns made of
    them, their flush spans (their traceparents set on the turns; a preparation not used
    ends none, so exports none) and their INSERT (rows.insert_statement), made last."""

    def __init__(self, found: list[sql.Row], message_rows: list[sql.Row], turns: list[Turn], by_buffer: ByBuffer) -> None:
        self.found, self.message_rows, self.turns, self.by_buffer = found, message_rows, turns, by_buffer
        self.started = spans.flushes(turns, by_buffer)
        self.statement = rows.insert_statement(Turn, turns)

    def holds(self, claimed: list[sql.Row], message_rows: list[sql.Row]) -> bool:
        """Whether the claim won every buffer read and nothing they are made of changed
        since: the buffers, conversations, channels, carried-over input, a turn ready or
        running there, and every message."""
        return message_rows == self.message_rows and sql.same_but_claimed(self.found, claimed)


def _prepare(ids: list[int], now: datetime, owner: str, start: int, token: str) -> _Prepared | None:
    """SQLite: the flush's turns made from the due buffers as they are, before its
    transaction, which holds the database's one write lock (most of a flush was this
    Python: building the rows' objects, merging, the INSERT's parameter). None where
    a flush writes more than its turns or reads beyond its rows: a group's buffer
    (context lines, unaddressed messages) and one over its channel's cap. None on
    PostgreSQL, which locks rows, not the database: its claim and read are one
    statement (sql.claim_rows), and a read before it one more wait for the server."""
    if rows.postgresql():
        return None
    found = sql.open_rows(ids, now)
    if not found:
        return None
    buffers = sql.build_buffers(found)
    if any(buffer.conversation.is_group for buffer in buffers):
        return None
    message_rows = sql.message_rows(buffer.pk for buffer in buffers)
    by_buffer = sql.build_messages(message_rows)
    if any(_first_beyond(by_buffer.get(buffer.pk, []), max(1, buffer.conversation.channel.max_messages)) is not None
           for buffer in buffers):
        return None
    for buffer in buffers:  # as the claim leaves them
        buffer.state, buffer.flushed_at, buffer.flushed_by = BufferState.FLUSHED, now, token
        buffer.flush_reason = buffer.planned_reason
    new_turns = [_turn_for(b, by_buffer.get(b.pk, []), now) for b in buffers]
    if start > 0:
        _born_running(new_turns, owner, now, start)
    return _Prepared(found, message_rows, new_turns, by_buffer)


def _count_flushes(flushes: Iterable[tuple[str, int]]) -> None:
    """(flush reason, messages merged) of each turn made: counted once its flush commits."""
    for reason, size in flushes:
        metrics.TURNS_FLUSHED.labels(reason).inc()
        metrics.MESSAGES_PER_TURN.observe(size)
        if size > 1:
            metrics.BURSTS_MERGED.inc()


def _born_running(new_turns: list[Turn], owner: str, now: datetime, room: int) -> None:
    """Mark up to `room` new turns RUNNING under `owner`: one per conversation with no
    turn ready or running (checked inside the flush's transaction; on PostgreSQL a
    concurrent start is refused by the one-running-turn index, and the flush retried)."""
    # Read with the claim (each new turn has its buffer).
    busy = {turn.conversation_id for turn in new_turns if turn.buffer is not None and turn.buffer.conversation_busy}
    for turn in new_turns:
        if room == 0:
            break
        if turn.conversation_id in busy or turn.conversation.channel.agent == turns.PULL_AGENT:
            continue
        turn.state, turn.owner, turn.started_at, turn.attempts = TurnState.RUNNING, owner, now, 1
        busy.add(turn.conversation_id)
        room -= 1


def _keep_the_rest_waiting(buffers: list[MessageBuffer], by_buffer: ByBuffer, now: datetime) -> None:
    """A turn takes at most its channel's `max_messages`, oldest first (an album's items
    counting once, never split). The rest move to a new open buffer, due at once, which
    flushes when this turn is over (the flusher skips a conversation with an active
    turn): a backlog becomes turns in order, each bounded. An admission racing this finds
    the new buffer when its own compare-and-swap on the claimed one fails (see
    ingest.admission._rearm)."""
    for buffer in buffers:
        messages = by_buffer.get(buffer.pk, [])
        limit = max(1, buffer.conversation.channel.max_messages)
        cut = _first_beyond(messages, limit)
        if cut is None:
            continue
        by_buffer[buffer.pk], rest = messages[:cut], messages[cut:]
        remainder = MessageBuffer.objects.create(
            conversation=buffer.conversation, first_message_at=rest[0].received_at,
            last_message_at=rest[-1].received_at, flush_at=now, planned_reason=FlushReason.MAX_MESSAGES,
            window_kind="cap", message_count=len(_starts(rest)), last_album_id=rest[-1].album_id)
        InboundMessage.objects.filter(pk__in=[m.pk for m in rest]).update(buffer=remainder)
        MessageBuffer.objects.filter(pk=buffer.pk).update(message_count=limit)


def _starts(messages: Sequence[InboundMessage]) -> list[int]:
    return windows.message_starts([m.album_id for m in messages])


def _first_beyond(messages: Sequence[InboundMessage], limit: int) -> int | None:
    """The index of the first message past `limit` messages (as they count), or None."""
    starts = _starts(messages)
    return starts[limit] if len(starts) > limit else None


def _turn_for(buffer: MessageBuffer, messages: Sequence[InboundMessage], now: datetime) -> Turn:
    last = messages[-1] if messages else None
    # Its agent: the first routing rule that matches, else the channel's (conversations.routing).
    rule, route = routing.choose(buffer.conversation, messages)
    return Turn(
        routing_rule=rule, route=route,
        conversation=buffer.conversation, buffer=buffer, created_at=now, flush_reason=buffer.flush_reason,
        merged_input=clip(groups.with_context(buffer, merge(messages, buffer.conversation.is_group,
                                                            buffer.carried_turn), now),
                          settings.AGENTLOOP_MAX_TURN_CHARS),
        # An interrupted turn's files come with its input (for_agents.file_ids_of_turn).
        has_media=any(m.media_file_id for m in messages) or bool(buffer.carried_turn and buffer.carried_turn.has_media),
        reply_target=last.reply_target if last else "", thread_id=last.thread_id if last else "",
    )


def flush_due(now: datetime | None = None, limit: int = 200, owner: str = "") -> list[Turn]:
    now = now or timezone.now()
    ids = due_buffer_ids(now, limit)
    return flush_many(ids, now, owner) if ids else []


def merge(messages: Iterable[InboundMessage], is_group: bool, carried_turn: Turn | None = None,
          limit: int | None = None) -> str:
    """One prompt from a burst: arrival order kept; in groups each line says who.

    At most `limit` characters (AGENTLOOP_MAX_TURN_CHARS): the newest text is kept and
    the cut marked, so an interrupted turn's input carried forward is the first to go —
    interrupts in a row never grow a turn's input beyond the cap. The stored messages
    keep all of it."""
    lines = [carried_turn.merged_input] if carried_turn is not None else []
    for message in messages:
        if is_group:
            lines.append(groups.line(message.sender_name, message.text, message.media_type))
        else:
            lines.append(f"[{message.media_type}] {message.text}".strip() if message.media_type else message.text)
    return clip("\n".join(lines), limit or settings.AGENTLOOP_MAX_TURN_CHARS)


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: its end, after a mark saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(f"[… {len(text)} characters cut]\n"))
    return f"[… {len(text) - keep} characters cut]\n{text[len(text) - keep:]}"
