"""agentloop.core.pruning's batch machinery: rows deleted by primary key with what their
foreign keys ask (cascade, set null) and without loading them; the batch's check read by
primary key on SQLite; the write lock free while SQLite's write-ahead log is copied back.
Runs on both databases."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Subquery
from django.db.models.signals import post_delete
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentloop.core import pruning
from audit.models import AuditEvent, EventKind
from conversations.models import InboundMessage, MessageEdit
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import is_postgres
from tools.models import ActionClaim, ClaimState, Confirmation, Proposal, ProposalState

pytestmark = pytest.mark.django_db
OLD = timezone.now() - timedelta(days=40)


@pytest.fixture
def chat(make_channel, make_conversation):
    return make_conversation(make_channel("prune"), "pia")


def ledger_row(chat, text="reply"):
    return OutboundMessage.objects.create(conversation=chat, channel=chat.channel, chat_id="1", text=text,
                                          state=OutboundState.DELIVERED, created_at=OLD)


def claim_asked_in_chat(chat, n, question):
    claim = ActionClaim.objects.create(scope=f"contact:{n}", action="email_send", fingerprint=f"f{n}",
                                       state=ClaimState.DONE, live=False, created_at=OLD, expires_at=OLD,
                                       lease_until=OLD)
    proposal = Proposal.objects.create(claim=claim, state=ProposalState.APPLIED, expires_at=OLD)
    Confirmation.objects.create(proposal=proposal, conversation=chat, question=question, text=f"send {n}?")
    return claim


def test_rows_go_with_their_cascade_and_set_null_references_without_loading_them(chat):
    kept_question, gone_question = ledger_row(chat, "kept"), ledger_row(chat, "gone")
    gone = [claim_asked_in_chat(chat, n, kept_question) for n in range(3)]
    stays = claim_asked_in_chat(chat, 9, gone_question)
    message = InboundMessage.objects.create(channel=chat.channel, conversation=chat, platform_message_id="m1",
                                            text="hi", received_at=OLD)
    MessageEdit.objects.create(message=message, conversation=chat, edited_at=OLD, source="api", outcome="unchanged")

    with CaptureQueriesContext(connection) as queries:
        pruning.delete_rows(ActionClaim, [c.pk for c in gone])
        pruning.delete_rows(OutboundMessage, [gone_question.pk])
        pruning.delete_rows(InboundMessage, [message.pk])
    # Claims cascade to their proposals, and those to their confirmations; the ledger row a
    # confirmation asked with is unlinked, the confirmation kept; a message's edits go with it.
    assert list(ActionClaim.objects.values_list("pk", flat=True)) == [stays.pk]
    assert list(Proposal.objects.values_list("claim_id", flat=True)) == [stays.pk]
    assert list(Confirmation.objects.values_list("text", "question_id")) == [("send 9?", None)]
    assert list(OutboundMessage.objects.values_list("text", flat=True)) == ["kept"]
    assert not InboundMessage.objects.exists() and not MessageEdit.objects.exists()
    # Only keys are read: no statement selects a row's other columns (Django's delete() did).
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert reads and all(" FROM " in sql and sql.split(" FROM ")[0].count(",") == 0 for sql in reads), reads


def test_a_model_with_a_delete_signal_goes_through_djangos_delete():
    event = AuditEvent.objects.create(kind=EventKind.CONTROL_COMMAND, at=OLD)
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_delete.connect(receiver, sender=AuditEvent, weak=False)
    try:
        pruning.delete_rows(AuditEvent, [event.pk])
    finally:
        post_delete.disconnect(receiver, sender=AuditEvent)
    assert seen == [event.pk] and not AuditEvent.objects.exists()


def test_the_batch_check_reads_the_ledger_by_primary_key(chat):
    rows = [ledger_row(chat, f"r{n}") for n in range(5)]
    pending = OutboundMessage.objects.create(conversation=chat, channel=chat.channel, chat_id="1", text="owed",
                                             state=OutboundState.PENDING, created_at=OLD)
    deletable = OutboundMessage.objects.filter(state=OutboundState.DELIVERED, created_at__lt=timezone.now())
    ids = [r.pk for r in rows] + [pending.pk]
    if not is_postgres():
        # Without statistics SQLite's planner took the state index: every delivered row read per batch.
        plain = deletable.filter(pk__in=ids).order_by().values_list("pk", flat=True)
        assert "USING INDEX" in plan(*plain.query.sql_with_params())
        assert "USING INTEGER PRIMARY KEY" in plan(*pruning.by_primary_key(plain))
    from django.db import transaction

    check = pruning._check(deletable, ids)
    with transaction.atomic():
        assert sorted(check()) == sorted(r.pk for r in rows)


def plan(sql, params) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return " ".join(str(row[-1]) for row in cursor.fetchall())


def test_a_query_that_is_not_a_plain_read_of_its_table_is_refused():
    first = Subquery(OutboundMessage.objects.order_by("pk").values("pk")[:1])
    query = OutboundMessage.objects.annotate(first=first).values_list("pk", "first")
    with pytest.raises(ValueError, match="not a plain query"):
        pruning.by_primary_key(query)
