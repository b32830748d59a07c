"""Turn transitions, each a compare-and-swap on the turn's row through the checked
`Turn.transition` (it refuses a move that `Turn.TRANSITIONS` does not allow).

`cancel` and `mark_effect` race on the same row and exactly one of them wins: a
turn that has fired an external effect can no longer be cancelled, and a cancelled
turn can no longer fire one.
"""

import functools
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agentloop.core import rows
from agentloop.core.redaction import redact
from audit.events import record
from audit.models import EventKind
from conversations.models import Channel, Conversation, Turn, TurnState
from delivery import ledger
from delivery.models import OutboundKind

EXTERNAL_GAVE_UP_NOTICE = (
    "Sorry — I could not answer your last message. Please send it again in a while."
)


def cancel(turn_id, reason, now=None) -> bool:
    """Cancel a ready or running turn that has not fired an external effect."""
    return Turn.transition(turn_id, Turn.ACTIVE, TurnState.CANCELLED, where={"fired_effect": False},
                           outcome=reason[:300], finished_at=now or timezone.now()) == 1


def mark_effect(turn_id, now=None) -> bool:
    """Call before an external effect; False means the turn was cancelled: do not act."""
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING).update(
        fired_effect=True, effect_fired_at=now or timezone.now()
    ) == 1


def start(turn_id, owner, now=None, where=None) -> bool:
    """READY -> RUNNING for `owner`. The partial unique index refuses a second
    running turn in the same conversation, so this is safe across processes."""
    try:
        with transaction.atomic():
            return Turn.transition(turn_id, TurnState.READY, TurnState.RUNNING, where=where, owner=owner,
                                   started_at=now or timezone.now(), attempts=F("attempts") + 1) == 1
    except IntegrityError:
        return False


def finish(turn_id, owner, *, state, reply_text="", outcome="", now=None) -> bool:
    """RUNNING -> DONE/FAILED for `owner`; False if it was cancelled meanwhile."""
    return turn_id in finish_many([(turn_id, state, reply_text, outcome[:300])], owner, now)


def finish_many(results, owner, now=None) -> set:
    """Finish running turns in one UPDATE (state, reply and outcome per row by CASE);
    returns the ids that were still this owner's to finish (not cancelled meanwhile)."""
    if not results:
        return set()
    now = now or timezone.now()
    results = [(r[0], r[1], r[2], redact(r[3])[:300]) for r in results]  # an agent's error may carry a secret
    Turn.check_transition([TurnState.RUNNING], {r[1] for r in results})
    for at in range(0, len(results), FINISH_CHUNK):
        _finish_chunk(results[at:at + FINISH_CHUNK], owner, now)
    ids = [r[0] for r in results]
    return set(Turn.objects.filter(pk__in=ids, owner=owner, finished_at=now,
                                   state__in=(TurnState.DONE, TurnState.FAILED)).values_list("pk", flat=True))


# Rows per statement (7 parameters each: SQLite takes 32,766 at most).
FINISH_CHUNK = 500


def _finish_chunk(results, owner, now):
    """The compare-and-swap of `Turn.transition` (RUNNING -> each row's state, this
    owner's only), in plain SQL: with hundreds of turns finishing together the ORM spent
    longer building three CASE expressions of hundreds of WHENs than the database spent
    running them (the worker's database thread, 500 simultaneous turns: 40% of its time).
    On PostgreSQL the rows come as one JSON parameter (UPDATE … FROM json_to_recordset):
    one statement text for any batch (agentloop/core/rows.py in_sql and recordset say why)."""
    finished_at = Turn._meta.get_field("finished_at").get_db_prep_value(now, connection)
    if rows.postgresql():
        with connection.cursor() as cursor:
            ends = rows.records(("id", "state", "reply", "outcome"), results)
            cursor.execute(_finish_sql_postgresql(), [finished_at, ends, TurnState.RUNNING, owner])
        return
    quote = connection.ops.quote_name
    whens = " ".join(["WHEN %s THEN %s"] * len(results))
    sql = (f"UPDATE {quote(Turn._meta.db_table)} SET "
           f"{quote('state')} = CASE {quote('id')} {whens} END, "
           f"{quote('reply_text')} = CASE {quote('id')} {whens} END, "
           f"{quote('outcome')} = CASE {quote('id')} {whens} END, "
           f"{quote('finished_at')} = %s "
           f"WHERE {quote('id')} IN ({rows.placeholders(len(results))}) "
           f"AND {quote('state')} = %s AND {quote('owner')} = %s")
    params = [value for column in (1, 2, 3) for r in results for value in (r[0], r[column])]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, finished_at, *(r[0] for r in results), TurnState.RUNNING, owner])


@functools.cache
def _finish_sql_postgresql():
    ends = rows.recordset("v", [("id", "bigint"), ("state", "text"), ("reply", "text"), ("outcome", "text")])
    return (f"UPDATE {rows.table(Turn)} AS t SET state = v.state, reply_text = v.reply, outcome = v.outcome, "
            f"finished_at = %s FROM {ends} WHERE t.id = v.id AND t.state = %s AND t.owner = %s")


def start_many(turn_ids, owner, now=None):
    """Start a batch of turns in one statement; if another worker started a turn in one
    of these conversations meanwhile (the unique index refuses the whole statement),
    fall back to one compare-and-swap each. Returns the turns this owner now runs."""
    if not turn_ids:
        return []
    now = now or timezone.now()
    try:
        with transaction.atomic():
            Turn.transition(list(turn_ids), TurnState.READY, TurnState.RUNNING, owner=owner, started_at=now,
                            attempts=F("attempts") + 1)
    except IntegrityError:
        for turn_id in turn_ids:
            start(turn_id, owner, now)
    return list(Turn.objects.filter(pk__in=turn_ids, state=TurnState.RUNNING, owner=owner, started_at=now)
                .select_related("conversation__channel"))


# Owners of turns handed to an external agent: "agent:<key id>" (a pull agent that
# claimed it) or this one (a webhook agent that will answer later through the API).
EXTERNAL_WEBHOOK = "agent:webhook"
# The agent whose turns wait for an external agent to claim them; workers never run them.
PULL_AGENT = "pull"


def external_owner(agent_key_id) -> str:
    return f"agent:{agent_key_id}"


def hand_over(turn_id, owner, new_owner) -> bool:
    """A running turn passes from its worker to an external agent (same state, new owner)."""
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=owner).update(
        owner=new_owner, started_at=timezone.now()) == 1


def claim_external(turn_id, agent_key_id, now=None) -> bool:
    """A pull agent takes a ready turn of a `pull` channel (READY -> RUNNING under its
    key). Other channels' turns are their workers' to run: a key claiming one would take
    it from its agent and answer in its place."""
    return start(turn_id, external_owner(agent_key_id), now,
                 where={"conversation__channel__agent": PULL_AGENT})


def may_answer(turn, agent_key_id) -> bool:
    return turn.state == TurnState.RUNNING and turn.owner in (external_owner(agent_key_id), EXTERNAL_WEBHOOK)


def release_external(now=None) -> list:
    """External turns not finished in time go back to READY (to be taken again) — up to
    AGENTLOOP_EXTERNAL_TURN_ATTEMPTS claims; then the turn fails and the user is told,
    rather than being offered to agents that keep dropping it, forever."""
    now = now or timezone.now()
    deadline = now - timedelta(seconds=settings.AGENTLOOP_EXTERNAL_TURN_TIMEOUT)
    stale = list(Turn.objects.filter(state=TurnState.RUNNING, owner__startswith="agent:", started_at__lt=deadline)
                 .select_related("conversation__channel"))
    released = []
    for turn in stale:
        if turn.attempts >= settings.AGENTLOOP_EXTERNAL_TURN_ATTEMPTS:
            give_up_external(turn, now)
        elif Turn.transition(turn.pk, TurnState.RUNNING, TurnState.READY, where={"owner": turn.owner},
                             owner="", started_at=None):
            released.append(turn.pk)
    return released


def give_up_external(turn, now) -> bool:
    """RUNNING -> FAILED for a turn external agents took and never finished, too often;
    the notice to the user is written in the same transaction."""
    why = f"no external agent finished it in {turn.attempts} attempts"
    with transaction.atomic():
        if not Turn.transition(turn.pk, TurnState.RUNNING, TurnState.FAILED, where={"owner": turn.owner},
                               outcome=why, finished_at=now):
            return False
        ledger.enqueue(turn.conversation, EXTERNAL_GAVE_UP_NOTICE, kind=OutboundKind.NOTICE, turn=turn,
                       reply_target=turn.reply_target, thread_id=turn.thread_id)
        record(EventKind.TURN_FAILED, conversation=turn.conversation, target=f"turn {turn.pk}",
               actor=turn.owner, summary=why)
    return True


def ready_candidates(limit):
    """Oldest ready turns, at most one per conversation and none where a turn runs
    (turns of a conversation run one at a time, in arrival order), leaving those that
    wait for an external agent. In SQL written once: every worker asks this many times
    a second (AGENTLOOP_POLL_INTERVAL), and compiling the query was most of its cost."""
    seen, picked = set(), []
    with connection.cursor() as cursor:
        cursor.execute(_ready_sql(), [TurnState.READY.value, PULL_AGENT, TurnState.RUNNING.value, limit * 2])
        for turn_id, conversation_id in cursor.fetchall():
            if conversation_id not in seen:
                seen.add(conversation_id)
                picked.append(turn_id)
    return picked[:limit]


@functools.cache
def _ready_sql():
    turn, conv = functools.partial(rows.column, Turn), functools.partial(rows.column, Conversation)
    return (f"SELECT t.id, t.{turn('conversation')} FROM {rows.table(Turn)} t "
            f"JOIN {rows.table(Conversation)} c ON c.id = t.{turn('conversation')} "
            f"JOIN {rows.table(Channel)} ch ON ch.id = c.{conv('channel')} "
            f"WHERE t.{turn('state')} = %s AND ch.{rows.column(Channel, 'agent')} <> %s AND NOT EXISTS ("
            f"SELECT 1 FROM {rows.table(Turn)} r WHERE r.{turn('conversation')} = t.{turn('conversation')} "
            f"AND r.{turn('state')} = %s) ORDER BY t.{turn('created_at')}, t.id LIMIT %s")
