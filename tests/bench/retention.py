"""The retention sweep measured while messages flow (issue 26): synthetic rows past their
retention (inbound messages, delivered ledger rows, audit events, claims past their
window), among them what the guarantees still need (an open buffer and its message, a
ready turn, a pending ledger row, a claim inside its window); webhook POSTs to a real
web server at a steady rate, and `manage.py sweepretention` in a process of its own in
10-second slices (as django-q2 runs it: a budget at a time), each after 10 seconds
without it. Figures: p99 admission latency (the POST's answer time) during the sweep
against without it (target <= 2x), rows deleted per second; checked: nothing the
guarantees need is gone.

    .venv/bin/python -m tests.bench retention      (1 million rows, 50 messages/s)

tests/end_to_end/test_retention_e2e.py runs the same at 50,000 rows."""

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import httpx

from tests.bench.loadgen import percentile

SECRET = "retention-secret"
KINDS = 4  # seeded in turn: a message, a delivered ledger row, an audit event, a claim past its window


@dataclass
class Seeded:
    deletable: int = 0
    kept: dict = field(default_factory=dict)  # what the guarantees need: model label -> ids
    last: dict = field(default_factory=dict)  # model label -> its newest seeded row's id


def seed(rows):
    """`rows` synthetic rows 40 days old (past every retention but the audit trail's: its
    events are 400 days old), with what must stay in the middle of them. Set-based
    (INSERT … SELECT over a generated series): 1 million rows in seconds, not minutes."""
    from django.utils import timezone

    from audit.models import AuditEvent, EventKind
    from conversations.models import Channel, Contact, Conversation, InboundMessage, MessageBuffer, Turn
    from delivery.models import OutboundMessage, OutboundState
    from tools.models import ActionClaim, ClaimState

    now = timezone.now()
    old, ancient = now - timedelta(days=40), now - timedelta(days=400)
    channel = Channel.objects.create(slug="old", kind="api")
    contact = Contact.objects.create(channel=channel, platform_id="old")
    chat = Conversation.objects.create(channel=channel, contact=contact, chat_id="old", sender_id="old")
    # Each kind: a template row and the fields that differ per copy (a prefix and the copy's number).
    kinds = [
        (InboundMessage(channel=channel, conversation=chat, text="x" * 80, received_at=old),
         {"platform_message_id": "old-"}),
        (OutboundMessage(conversation=chat, channel=channel, chat_id="old", text="y" * 80,
                         state=OutboundState.DELIVERED, created_at=old), {}),
        (AuditEvent(kind=EventKind.CONTROL_COMMAND, at=ancient, summary="old event"), {}),
        (ActionClaim(action="email_send", state=ClaimState.DONE, live=False, created_at=old, expires_at=old,
                     lease_until=old), {"scope": "contact:", "fingerprint": "f"}),
    ]
    per_kind = rows // KINDS
    half = per_kind // 2
    for template, varying in kinds:
        insert_copies(template, range(0, half), varying)
    buffer = MessageBuffer.objects.create(conversation=chat, first_message_at=old, last_message_at=old,
                                          flush_at=old)
    seeded = Seeded(deletable=per_kind * KINDS, kept={
        "conversations.MessageBuffer": [buffer.pk],
        "conversations.InboundMessage": [InboundMessage.objects.create(
            channel=channel, conversation=chat, platform_message_id="open", received_at=old, buffer=buffer).pk],
        "conversations.Turn": [Turn.objects.create(conversation=chat, merged_input="ready", created_at=old,
                                                   flush_reason="window").pk],
        "delivery.OutboundMessage": [OutboundMessage.objects.create(
            conversation=chat, channel=channel, chat_id="old", text="owed", state=OutboundState.PENDING,
            created_at=old).pk],
        "tools.ActionClaim": [ActionClaim.objects.create(
            scope="contact:window", action="email_send", fingerprint="window", state=ClaimState.DONE,
            live=True, created_at=old, expires_at=now + timedelta(days=1), lease_until=old).pk],
    })
    for template, varying in kinds:
        insert_copies(template, range(half, per_kind), varying)
        model = type(template)
        seeded.last[model._meta.label] = model.objects.order_by("-pk").values_list("pk", flat=True).first()
    return seeded


def left(seeded) -> bool:
    """Whether a seeded row the sweep should delete is still there."""
    from django.apps import apps

    return any(apps.get_model(label).objects.filter(pk__lte=last).count() > len(seeded.kept.get(label, []))
               for label, last in seeded.last.items())


def insert_copies(template, numbers, varying):
    """One INSERT … SELECT: a copy of the unsaved `template` per number in `numbers`,
    each field named in `varying` set to its prefix followed by the number."""
    from django.db import connection

    if not numbers:
        return
    model, quote = type(template), connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    values, params = [], []
    for f in fields:
        if f.name in varying:
            values.append("%s || CAST(i AS TEXT)")
            params.append(varying[f.name])
        else:
            values.append("%s")
            params.append(f.get_db_prep_save(f.pre_save(template, add=True), connection))
    if connection.vendor == "postgresql":
        series = "generate_series(%s::int, %s::int) AS series(i)"  # typed: parameters are bound on the server
    else:
        series = "(WITH RECURSIVE series(i) AS (SELECT %s UNION ALL SELECT i + 1 FROM series WHERE i < %s) " \
                 "SELECT i FROM series)"
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"SELECT {', '.join(values)} FROM {series}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, numbers.start, numbers.stop - 1])


def missing(seeded) -> list[str]:
    """What the guarantees need that the sweep deleted (empty: nothing)."""
    from django.apps import apps

    gone = []
    for label, ids in seeded.kept.items():
        left = set(apps.get_model(label).objects.filter(pk__in=ids).values_list("pk", flat=True))
        gone += [f"{label} {pk}" for pk in ids if pk not in left]
    return gone


def telegram_channel(fake_url, slug="tg"):
    from conversations.models import Channel

    return Channel.objects.create(slug=slug, kind="telegram", platform_settings={
        "bot_token": "4242:RETENTION", "webhook_secret": SECRET, "api_base": fake_url})


class Flow:
    """New chats' messages POSTed to the webhook at `rate` a second (one keep-alive client
    on a fixed schedule); each POST's answer time in ms, with its status, tagged by phase."""

    def __init__(self, url, rate=50, slug="tg"):
        self.url, self.rate, self.slug = f"{url}/webhooks/telegram/{slug}/", rate, slug
        self.phase, self.times, self.statuses = "without", {}, []
        self.log = []  # (phase, seconds since the flow began, ms): var/bench-logs/retention-latencies.json
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        from tests.support.e2e import update

        began, n = time.monotonic(), 0
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                pause = began + n / self.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                phase, sent = self.phase, time.perf_counter()
                try:
                    status = http.post(self.url, json=update(3_000_000 + n, f"hola {n}"),
                                       headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}).status_code
                except httpx.HTTPError:
                    status = 0
                ms = (time.perf_counter() - sent) * 1000
                self.times.setdefault(phase, []).append(ms)
                self.log.append((phase, round(time.monotonic() - began, 3), round(ms, 2)))
                self.statuses.append(status)
                n += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def measure(url, run_sweep, left, slice_seconds=10.0, rate=50):
    """Admission latencies with the sweep in slices, each after as long without it:
    `run_sweep(seconds)` starts a sweep process of that budget, `left()` says whether it
    has rows left to delete. Interleaved, both phases see the same load from whatever
    else the machine runs (two shared cores: a reference taken once, before, varied
    from 10 to 47 ms in p99 between runs). Returns (flow, the sweep's seconds, its
    slices, the exit code of the first that failed, or 0)."""
    seconds, slices = 0.0, 0
    with Flow(url, rate) as flow:
        while True:
            flow.phase = "without"
            time.sleep(slice_seconds)
            if not left():
                return flow, seconds, slices, 0
            flow.phase = "during"
            began = time.monotonic()
            code = run_sweep(slice_seconds).wait(3600)
            seconds, slices = seconds + time.monotonic() - began, slices + 1
            if code:
                return flow, seconds, slices, code


def summary(flow, rows, seconds, slices=1) -> tuple[str, float, float]:
    """The figures in words, and p99 without and during."""
    without, during = flow.times.get("without", []), flow.times.get("during", [])
    p99_without, p99_during = percentile(without, 99, 0.0), percentile(during, 99, 0.0)
    ratio = p99_during / p99_without if p99_without else 0.0
    line = (f"sweep of {rows:,} rows past their retention in {seconds:.1f} s ({rows / max(seconds, 1e-9):,.0f} rows/s"
            f", {slices} slices) while {flow.rate} messages/s were admitted: p99 admission {p99_during:.1f} ms during vs "
            f"{p99_without:.1f} ms without ({len(during)} and {len(without)} POSTs): ratio {ratio:.2f} "
            f"(target <= 2: {'met' if ratio <= 2 else 'NOT MET'}); p50 {percentile(during, 50, 0.0):.1f} vs "
            f"{percentile(without, 50, 0.0):.1f} ms")
    return line, p99_without, p99_during


def bench_retention(kit, rows=1_000_000, rate=50, slice_seconds=10.0):
    """`kit`: the runner (tests.bench.__main__): report, start, stop, web_server, wait_until."""
    import sys

    from tests.fakes.telegram_api import FakeBotAPI

    began = time.monotonic()
    seeded = seed(rows)
    print(f"[retention] seeded {rows:,} rows in {time.monotonic() - began:.0f} s", flush=True)
    with FakeBotAPI() as fake:
        telegram_channel(fake.url)
        web, url = kit.web_server()
        try:
            flow, seconds, slices, code = measure(url, lambda budget: kit.start(
                "sweep", [sys.executable, "manage.py", "sweepretention", "--budget", str(budget)]),
                lambda: left(seeded), slice_seconds, rate)
        finally:
            kit.stop(web)
    from django.db import connection

    assert code == 0, "the sweep failed: var/bench-logs/sweep.log"
    gone = missing(seeded)
    refused = sum(1 for s in flow.statuses if s != 200)
    line, _, _ = summary(flow, seeded.deletable, seconds, slices)
    (kit.LOGS / "retention-latencies.json").write_text(json.dumps(flow.log))
    kit.report("retention", f"{line}; kept what the guarantees need: {'yes' if not gone else f'NO, deleted {gone}'}; "
                            f"POSTs not answered 200: {refused}; {connection.vendor}")
