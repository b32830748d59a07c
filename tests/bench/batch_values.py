"""What a batch insert's values cost inside the transaction (`agentloop.core.rows`):
the product's preparers beside Django's own `get_db_prep_save(pre_save(…))` chain, in
the same run, for a batch of 16 rows of each model the hot path inserts in batches (a
new chat's contact, conversation, buffer and message on the web's admission; a flush's
turns and a completion's ledger rows on the worker). On SQLite every one of these
transactions holds the database's one write lock (docs/scaling.md, section 2).

    .venv/bin/python -m tests.bench.batch_values                        # SQLite, a scratch file
    DATABASE_URL=postgres://…/scratch .venv/bin/python -m tests.bench.batch_values

Also prints each whole `insert_many` (values, JSON, the statement) in a transaction,
for the values' share of it. The database's tables are written to: give it one of its own.
"""

import sys
import time
from datetime import UTC, datetime

from tests.bench import statements

BATCH = 16
ROUNDS = 300


def batches():
    """(model, a function making BATCH fresh instances), as the hot path fills them."""
    from conversations.models import Channel, Contact, Conversation, InboundMessage, MessageBuffer, Turn
    from delivery.models import OutboundKind, OutboundMessage

    now = datetime.now(UTC)
    channel, _ = Channel.objects.get_or_create(slug="bench-values", defaults={"name": "values", "kind": "telegram"})
    contact, _ = Contact.objects.get_or_create(channel=channel, platform_id="1")
    conversation, _ = Conversation.objects.get_or_create(channel=channel, contact=contact, chat_id="1",
                                                         sender_id="1")

    others = [Conversation.objects.get_or_create(channel=channel, contact=contact, chat_id=f"b{i}",
                                                 sender_id=f"b{i}")[0] for i in range(BATCH)]
    # A turn each (one turn per buffer), a new buffer each (one open buffer per conversation).
    buffers = [MessageBuffer.objects.create(conversation=other, first_message_at=now, last_message_at=now,
                                            flush_at=now, state="flushed") for other in others]
    buffer = buffers[0]

    def many(make):
        return lambda: [make(i) for i in range(BATCH)]

    return [
        (Contact, many(lambda i: Contact(channel=channel, platform_id=f"c{i}", display_name="Ana", created_at=now))),
        (Conversation, many(lambda i: Conversation(channel=channel, contact=contact, chat_id=f"c{i}",
                                                   sender_id=f"c{i}", created_at=now, last_message_at=now))),
        (MessageBuffer, many(lambda i: MessageBuffer(conversation=others[i], first_message_at=now,
                                                     last_message_at=now, flush_at=now, message_count=1))),
        (InboundMessage, many(lambda i: InboundMessage(channel=channel, conversation=conversation, buffer=buffer,
                                                       platform_message_id=f"m{i}", text="mensaje y",
                                                       received_at=now, sent_at=now))),
        (Turn, many(lambda i: Turn(conversation=others[i], buffer=buffers[i], created_at=now, merged_input="hola y",
                                   flush_reason="window"))),
        (OutboundMessage, many(lambda i: OutboundMessage(channel=channel, conversation=conversation, chat_id="1",
                                                         kind=OutboundKind.REPLY, text="hola y", chunks=[],
                                                         created_at=now))),
    ]


def per_batch(work, rounds=ROUNDS):
    """CPU milliseconds per call of `work`, over `rounds` calls."""
    start = time.process_time()
    for _ in range(rounds):
        work()
    return (time.process_time() - start) / rounds * 1000


def main():
    statements.setup("bench-batch-values")
    from django.db import connection, transaction

    from agentloop.core import rows

    print(f"batch_values: {BATCH} rows a batch, {ROUNDS} batches each, {connection.vendor}; ms of CPU per batch")
    totals = {"django": 0.0, "ours": 0.0}
    for model, make in batches():
        _, fields = rows._insert_sql(model, (), ("id",), True)
        preparers = rows._preparers(tuple(fields))
        instances = make()

        def django_chain(instances=instances, fields=fields):
            return [[f.get_db_prep_save(f.pre_save(x, True), connection) for f in fields] for x in instances]

        def ours(instances=instances, preparers=preparers):
            return [[prepare(x) for prepare in preparers] for x in instances]

        for row_ours, row_theirs in zip(ours(), django_chain(), strict=True):
            for field, mine, theirs in zip(fields, row_ours, row_theirs, strict=True):
                if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
                    continue  # "now" at each call, Django's way in both
                assert rows._json_value(mine) == rows._json_value(theirs), (model.__name__, field.name, mine, theirs)

        def insert(model=model, make=make):
            with transaction.atomic():
                rows.insert_many(model, make())
                transaction.set_rollback(True)  # the same rows again next round (unique keys)

        theirs, mine, whole = per_batch(django_chain), per_batch(ours), per_batch(insert, ROUNDS // 3)
        totals["django"] += theirs
        totals["ours"] += mine
        print(f"  {model.__name__:16} values: Django's chain {theirs:.3f}, ours {mine:.3f} ({mine / theirs:.2f}x); "
              f"the whole insert_many in a transaction {whole:.3f}")
    print(f"batch_values: all six batches' values {totals['ours']:.2f} ms against Django's chain "
          f"{totals['django']:.2f} ms: {totals['ours'] / totals['django']:.2f}x (same values, checked); "
          f"reproduce with: .venv/bin/python -m tests.bench.batch_values")


if __name__ == "__main__":
    sys.exit(main())
