"""The looks every worker makes many times a second name their states in the SQL text,
not as parameters (agentloop.core.rows.state_literal). On PostgreSQL a statement run a
fifth time on a connection is prepared, and the server may then plan it once for any
parameter value: for the ledger's `SELECT 1 … WHERE state = $1 LIMIT 1` that generic
plan was a table scan, cheap on average over the states, which for `pending` (no row
in it) read the whole ledger — 45-80 ms per look three minutes into the sustained run,
twenty looks a second, growing with the ledger (issue 30). The plan of each look is
checked as the server would cache it (plan_cache_mode = force_generic_plan) over a
table of finished rows with its statistics, and must probe an index, never scan."""

import itertools
import re

import pytest
from django.db import connection
from django.utils import timezone

from conversations import turns
from conversations.models import Turn, TurnState
from conversations.sql import admission
from delivery.ledger import claiming
from delivery.models import OutboundKind, OutboundMessage, OutboundState

pytestmark = pytest.mark.django_db
FINISHED = 1000  # enough rows for the planner to tell a scan from a probe
STATES = {*TurnState.values, *OutboundState.values}


@pytest.fixture
def history(make_channel, make_conversation):
    """A ledger and turns that are all finished, with the planner's statistics of them."""
    conversation = make_conversation(make_channel())
    Turn.objects.bulk_create([Turn(conversation=conversation, merged_input="x", flush_reason="window",
                                   state=TurnState.DONE) for _ in range(FINISHED)])
    OutboundMessage.objects.bulk_create([
        OutboundMessage(conversation=conversation, channel=conversation.channel, chat_id="ana",
                        kind=OutboundKind.REPLY, text="r", state=OutboundState.DELIVERED) for _ in range(FINISHED)])
    with connection.cursor() as cursor:
        # These two tables only: PostgreSQL keeps an ANALYZE's row counts (pg_class) after
        # the test's rollback, and an empty table's then let the plan tests of other
        # tables (tests.unit.test_big_tables) take any index at the same cost.
        for model in (Turn, OutboundMessage):
            cursor.execute(f"ANALYZE {model._meta.db_table}")
    return conversation


def statements_of(call):
    """(sql, params) of each statement `call` runs, as the driver is given them."""
    ran = []

    def record(execute, sql, params, many, context):
        ran.append((sql, list(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        call()
    return ran


def generic_plan(sql, params) -> str:
    """PostgreSQL's plan of `sql` prepared once for any value of its parameters."""
    from psycopg.sql import Literal

    numbers = itertools.count(1)
    prepared = re.sub(r"%s", lambda _: f"${next(numbers)}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE look AS {prepared}")
        try:  # EXECUTE takes no bound parameters: the values as literals
            values = ", ".join(Literal(value).as_string(connection.connection) for value in params)
            cursor.execute(f"EXPLAIN EXECUTE look{f'({values})' if params else ''}")
            return " ".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE look")


LOOKS = {
    "the ledger's look for claimable rows": lambda: claiming.maybe_claimable(["vm:1:dead"], timezone.now()),
    "the turn claimer's look for ready turns": lambda: turns.ready_candidates(200),
    "an admission's read of its conversation": lambda: admission.conversation_with_state(1, "ana", "ana"),
}


@pytest.mark.parametrize("look", LOOKS)
def test_a_hot_look_names_its_states_in_its_text(history, look):
    ran = statements_of(LOOKS[look])
    assert ran
    for sql, params in ran:
        assert not STATES.intersection(p for p in params if isinstance(p, str)), (sql, params)
        if connection.vendor == "postgresql":
            plan = generic_plan(sql, params)
            assert not re.search(r"Seq Scan on (delivery_outboundmessage|conversations_turn)\b", plan), plan
            assert "turn_created_idx" not in plan, plan  # every turn walked in creation order


def test_a_state_literal_is_a_state_name_and_nothing_else():
    from agentloop.core.rows import state_literal

    assert state_literal(OutboundState.PENDING) == "'pending'"
    for bad in ("pending' OR '1'='1", "", "Pending", "a b"):
        with pytest.raises(ValueError):
            state_literal(bad)
