"""The debounce engine's database steps: flush due buffers into turns, recover the
work of dead workers. Each step is small, restartable and safe to run in any number
of processes at once: every claim is a compare-and-swap.

The timing lives in the worker loop (conversations/worker.py), which sleeps until
the earliest deadline; django-q2 runs `recovery_sweep` as a slower safety net.
"""

import itertools
import logging
import os
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from agentloop.core import metrics, rows
from audit.events import record
from audit.failpoints import after_commit
from audit.models import EventKind
from conversations import console, groups, liveness, schedules, spans, sql, turns, windows
from conversations.media import for_agents
from conversations.models import (
    BufferState,
    Channel,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
    WorkerHeartbeat,
)
from delivery import ledger
from delivery.models import OutboundKind

log = logging.getLogger(__name__)

# After a streamed reply cut short by a crash of its worker (the turn had acted: it is
# not run again), below what was saved of it.
INTERRUPTED_NOTE = _("⚠️ I was interrupted here, and part of what I was doing may already be done. "
                    "Please check before asking again.")
RECOVERY_NOTICE = _(
    "Sorry — something went wrong while I was working on your last message, and part of "
    "it may already be done. Please check before asking again."
)


# --- flushing ----------------------------------------------------------------

def due_buffer_ids(now, limit=200):
    """Open buffers whose deadline passed, oldest deadline first. A buffer whose
    conversation has a turn ready or running waits (enqueue): it flushes when that turn
    ends, so everything said meanwhile becomes one next turn."""
    return sql.due_buffer_ids(now, limit)


def next_deadline(now):
    """The nearest future deadline, or None."""
    return sql.next_deadline(now)


def look(now, limit=200):
    """The flusher's look: (due_buffer_ids, next_deadline) in one statement — one wait
    for the database per wake-up instead of two, on the flusher's timed path and in the
    idle floor every worker costs (20 looks a second)."""
    return sql.look(now, limit)


def flush_buffer(buffer_id, now=None):
    """Claim one due buffer and turn it into a READY turn; None when another process
    flushed it or a new message re-armed it."""
    flushed = flush_many([buffer_id], now or timezone.now())
    return flushed[0] if flushed else None


_batches = itertools.count(1)


def flush_many(buffer_ids, now, owner="", start=0):
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
    token = f"{owner or new_owner()}#{next(_batches)}"
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


def _turns_of(buffers, by_buffer, now, owner, start):
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

    def __init__(self, found, message_rows, turns, by_buffer):
        self.found, self.message_rows, self.turns, self.by_buffer = found, message_rows, turns, by_buffer
        self.started = spans.flushes(turns, by_buffer)
        self.statement = rows.insert_statement(Turn, turns)

    def holds(self, claimed, message_rows):
        """Whether the claim won every buffer read and nothing they are made of changed
        since: the buffers, conversations, channels, carried-over input, a turn ready or
        running there, and every message."""
        return message_rows == self.message_rows and sql.same_but_claimed(self.found, claimed)


def _prepare(ids, now, owner, start, token):
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


def _count_flushes(flushes):
    """(flush reason, messages merged) of each turn made: counted once its flush commits."""
    for reason, size in flushes:
        metrics.TURNS_FLUSHED.labels(reason).inc()
        metrics.MESSAGES_PER_TURN.observe(size)
        if size > 1:
            metrics.BURSTS_MERGED.inc()


def _born_running(new_turns, owner, now, room):
    """Mark up to `room` new turns RUNNING under `owner`: one per conversation with no
    turn ready or running (checked inside the flush's transaction; on PostgreSQL a
    concurrent start is refused by the one-running-turn index, and the flush retried)."""
    busy = {turn.conversation_id for turn in new_turns if turn.buffer.conversation_busy}  # read with the claim
    for turn in new_turns:
        if room == 0:
            break
        if turn.conversation_id in busy or turn.conversation.channel.agent == turns.PULL_AGENT:
            continue
        turn.state, turn.owner, turn.started_at, turn.attempts = TurnState.RUNNING, owner, now, 1
        busy.add(turn.conversation_id)
        room -= 1


def _keep_the_rest_waiting(buffers, by_buffer, now):
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


def _starts(messages):
    return windows.message_starts([m.album_id for m in messages])


def _first_beyond(messages, limit):
    """The index of the first message past `limit` messages (as they count), or None."""
    starts = _starts(messages)
    return starts[limit] if len(starts) > limit else None


def _turn_for(buffer, messages, now):
    last = messages[-1] if messages else None
    return Turn(
        conversation=buffer.conversation, buffer=buffer, created_at=now, flush_reason=buffer.flush_reason,
        merged_input=clip(groups.with_context(buffer, merge(messages, buffer.conversation.is_group,
                                                            buffer.carried_turn), now),
                          settings.AGENTLOOP_MAX_TURN_CHARS),
        # An interrupted turn's files come with its input (for_agents.file_ids_of_turn).
        has_media=any(m.media_file_id for m in messages) or bool(buffer.carried_turn and buffer.carried_turn.has_media),
        reply_target=last.reply_target if last else "", thread_id=last.thread_id if last else "",
    )


def flush_due(now=None, limit=200, owner=""):
    now = now or timezone.now()
    ids = due_buffer_ids(now, limit)
    return flush_many(ids, now, owner) if ids else []


def merge(messages, is_group, carried_turn=None, limit=None):
    """One prompt from a burst: arrival order kept; in groups each line says who.

    At most `limit` characters (AGENTLOOP_MAX_TURN_CHARS): the newest text is kept and
    the cut marked, so an interrupted turn's input carried forward is the first to go —
    interrupts in a row never grow a turn's input beyond the cap. The stored messages
    keep all of it."""
    lines = [carried_turn.merged_input] if carried_turn is not None else []
    for message in messages:
        text = message.text
        if message.media_type:
            text = f"[{message.media_type}] {text}".strip()
        lines.append(f"{message.sender_name or 'Someone'}: {text}" if is_group else text)
    return clip("\n".join(lines), limit or settings.AGENTLOOP_MAX_TURN_CHARS)


def clip(text, limit):
    """`text` in at most `limit` characters: its end, after a mark saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(f"[… {len(text)} characters cut]\n"))
    return f"[… {len(text) - keep} characters cut]\n{text[len(text) - keep:]}"


# --- workers and recovery ------------------------------------------------------

def new_owner(lock=False):
    """`host:pid:start:random` — with the process's start time, so that a later process
    given the same pid (a restart in a container often is) is not taken for it. `lock`:
    its worker will hold a liveness lock (conversations/liveness.py), said by a fifth
    field — so the others judge it by that lock, not by its heartbeat."""
    pid = os.getpid()
    owner = f"{settings.AGENTLOOP_HOSTNAME}:{pid}:{process_started(pid) or 0}:{os.urandom(3).hex()}"
    return f"{owner}:{liveness.LOCK_MARK}" if lock else owner


def process_started(pid) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat, field
    22): with the pid, it names one process for the life of the host. None when there
    is no such process; "" when this system cannot tell (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") or not _pid_alive(pid) else ""
    except OSError:
        return ""
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def owner_gone(owner, hostname=None, pid=None) -> bool:
    """Whether the worker behind `owner` is visibly gone: it ran on this host and its pid
    is free now or names a process started since, or it held a liveness lock that
    nobody holds now (any host: the database ended its session). Such an owner is dead
    at once — no need to wait for its heartbeat or leases to expire. Another host's
    owner without a lock is not judged here (its heartbeat tells)."""
    return gone_from_this_host(owner, hostname, pid) or owner in (liveness.released([owner]) or ())


def gone_from_this_host(owner, hostname=None, pid=None) -> bool:
    parts = owner.split(":")
    started = None
    if len(parts) in (4, 5) and parts[1].isdigit():  # new_owner()'s form
        hostname, pid, started = parts[0], int(parts[1]), parts[2]
    elif hostname is None and len(parts) == 3 and parts[1].isdigit():  # before start times
        hostname, pid = parts[0], int(parts[1])
    if hostname != settings.AGENTLOOP_HOSTNAME or pid is None:
        return False
    now_started = process_started(pid)
    if now_started is None:
        return True
    return bool(started and started != "0" and now_started and now_started != started)


def beat(owner, now=None):
    now = now or timezone.now()
    updated = WorkerHeartbeat.objects.filter(owner=owner).update(seen_at=now)
    if not updated:  # the first beat, or the others took this worker for dead and forgot it
        WorkerHeartbeat.objects.create(owner=owner, hostname=settings.AGENTLOOP_HOSTNAME, pid=os.getpid(),
                                       started_at=now, seen_at=now)


def retire(owner):
    WorkerHeartbeat.objects.filter(owner=owner).delete()


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_owners(now=None):
    """Owners that are dead: a lock holder whose lock is free (whatever its heartbeat
    says — a worker holding its lock is alive however stale its row), any other whose
    heartbeat went stale, and any whose process on this host is gone. Two statements:
    the heartbeats, then the locks held (in that order: see liveness.released)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.AGENTLOOP_WORKER_STALE_AFTER)
    rows = list(WorkerHeartbeat.objects.values_list("owner", "hostname", "pid", "seen_at"))
    lock_free = liveness.released(owner for owner, *_ in rows)
    dead = []
    for owner, hostname, pid, seen_at in rows:
        judged_by_lock = lock_free is not None and liveness.marks_lock(owner)
        if ((judged_by_lock and owner in lock_free) or (seen_at < stale and not judged_by_lock)
                or gone_from_this_host(owner, hostname, pid)):
            dead.append(owner)
    return dead


def recover_turns(owners, now=None):
    """Turns left RUNNING by dead workers; returns the ids that will run again."""
    running = Turn.objects.filter(state=TurnState.RUNNING, owner__in=list(owners)).select_related("conversation")
    return [turn.pk for turn in running if give_up_turn(turn, now) == TurnState.READY]


def give_back_orphans(owner, held, older_than, now=None):
    """RUNNING turns stamped with a live `owner` that it does not hold (`held`: the ids
    it runs or is finishing) — e.g. a start whose answer was lost with the connection.
    Only turns started more than `older_than` seconds ago: a fresh one may be on its
    way to the owner. Returns the ids given back."""
    now = now or timezone.now()
    orphans = (Turn.objects.filter(state=TurnState.RUNNING, owner=owner,
                                   started_at__lt=now - timedelta(seconds=older_than))
               .exclude(pk__in=list(held)).select_related("conversation"))
    return [turn.pk for turn in orphans if give_up_turn(turn, now)]


def give_up_turn(turn, now=None):
    """A running turn its worker no longer runs (it died, or it is shutting down): run it
    again if it fired no effect (nothing external happened yet); otherwise never re-run
    it blindly — fail it and tell the user part of it may be done. Returns the new state,
    or None if the turn was no longer this owner's."""
    now = now or timezone.now()
    with transaction.atomic():
        mine = {"owner": turn.owner}
        if Turn.transition(turn.pk, TurnState.RUNNING, TurnState.READY, where={**mine, "fired_effect": False},
                           owner=""):
            record(EventKind.TURN_RECOVERED, conversation=turn.conversation, target=f"turn {turn.pk}",
                   actor=turn.owner, summary="its worker let go before any effect; it will run again")
            return TurnState.READY
        if Turn.transition(turn.pk, TurnState.RUNNING, TurnState.FAILED, where=mine, finished_at=now,
                           outcome="its worker let go after it fired an effect"):
            # A streamed reply: what was saved of it, marked as interrupted, replaces its
            # preview (docs/streaming.md); read now, not from `turn`, which may be older.
            streamed, preview = Turn.objects.filter(pk=turn.pk).values_list(
                "streamed_text", "preview_message_id").get()
            text = (format_lazy("{}\n\n{}", streamed.rstrip(), INTERRUPTED_NOTE) if streamed.strip()
                    else RECOVERY_NOTICE)
            ledger.enqueue_many([ledger.Reply(turn.conversation, text, OutboundKind.NOTICE, turn=turn,
                                              reply_target=turn.reply_target, thread_id=turn.thread_id,
                                              preview_message_id=preview)])
            record(EventKind.TURN_FAILED, conversation=turn.conversation, target=f"turn {turn.pk}",
                   actor=turn.owner, summary="its worker let go after an external effect; not re-run")
            return TurnState.FAILED
    return None


def forget_workers(owners):
    """Drop heartbeats of dead workers once nothing they held is left running or mid-send."""
    for owner in owners:
        busy = Turn.objects.filter(owner=owner, state=TurnState.RUNNING).exists() or ledger.holds_rows(owner)
        if not busy:
            WorkerHeartbeat.objects.filter(owner=owner).delete()


def agents_in_use():
    """(agent, config) of every active channel, for the worker to prepare at start."""
    return list(Channel.objects.filter(is_active=True).values_list("agent", "agent_config"))


def recovery_sweep(grace_seconds=5.0):
    """django-q2's safety net: if no worker loop is alive, overdue buffers still become
    turns, dead workers' turns are released and due scheduled messages are written to the
    ledger (whose own safety sweep sends them). Scheduled every minute."""
    now = timezone.now()
    owners = dead_owners(now)
    recovered = recover_turns(owners, now)
    recovered += turns.release_external(now)
    flushed = flush_due(now - timedelta(seconds=grace_seconds))
    scheduled = schedules.send_due(now)  # a tick races a live worker harmlessly (one key per tick)
    forget_workers(owners)
    if recovered or flushed or scheduled:
        log.info("recovery sweep: %d turns recovered, %d buffers flushed, %d scheduled messages written",
                 len(recovered), len(flushed), scheduled)
    return {"recovered": len(recovered), "flushed": len(flushed), "scheduled": scheduled}


def conversation_history(conversation, before_turn, limit=20):
    """The agent's context since the last /reset, oldest first: each finished turn as a
    user message and the assistant's reply, and the notes added meanwhile (a person's
    decision on a proposal) as system messages (`conversations.sql.history`). A turn's
    files are carried as the lines that describe them (and a voice note's transcript),
    not their bytes again."""
    turns_before, notes = sql.history(conversation.pk, before_turn.pk, conversation.context_reset_at, limit)
    seen = for_agents.seen_by_turns([turn for turn in turns_before if turn.has_media])
    entries = []
    for turn in turns_before:
        content = f"{turn.merged_input}\n{seen[turn.pk]}" if seen.get(turn.pk) else turn.merged_input
        entries.append((turn.created_at, 0, {"role": "user", "content": content}))
        if turn.reply_text:
            entries.append((turn.created_at, 1, {"role": "assistant", "content": turn.reply_text}))
    for note in notes:
        entries.append((note.created_at, 2, {"role": "system", "content": note.text}))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [message for _, _, message in entries]
