"""Per platform (issue 54): accepted inbound messages/s and the paced drain into one chat,
each beside Telegram's figure of the same run.

    .venv/bin/python -m tests.bench platforms
    DATABASE_URL=postgres://…/scratch .venv/bin/python -m tests.bench platforms   # flushed first

1. **Inbound.** Webhook platforms (Telegram, WhatsApp, Slack, Google Chat, Teams, Messenger,
   Instagram): the web server
   alone (no worker), tests/bench/loadgen.py POSTing the platform's own payloads, each
   authenticated as the platform does it (Telegram's secret header, Meta's
   X-Hub-Signature-256, Slack's v0 signature, Chat's bearer JWT checked against the
   fake's certificates, the Bot Connector's bearer JWT checked against the fake's OpenID
   keys for Teams, X-Twilio-Signature over the public URL and the form for SMS), 16 keep-alive clients, 200 conversations. A warm-up of WARMUP
   requests per platform is not counted; then ROUNDS rounds, platforms interleaved, of
   WINDOW_SECONDS each: accepted (2xx) POSTs/s, the median of the rounds. Discord, a
   Connection platform: a worker holding its Gateway session (the real connection
   runner), the fake Gateway dispatching MESSAGE_CREATE events (DMs) as fast as its
   socket takes them; the rate the messages were admitted at, from their `received_at`,
   after WARMUP warm-up messages and the first tenth of the measured burst. Each beside
   Telegram's as a ratio.
2. **The paced drain.** N replies owed to one chat per platform (N: DRAIN_SECONDS of its
   ceiling), written to the ledger as pending rows, drained by one worker through the
   platform's transport against its fake keeping the documented limits: Telegram's 1
   message a second into a chat (tests/fakes/telegram_api.Limits), Slack's about one a
   second into a channel, Discord's bucket of 5 per 5 s per channel, Google Chat's 60
   writes a minute into a space (kept as one a second), Teams' 1800 an hour into a
   thread (with 7/s, 8 in 2 s and 60 in 30 s; kept as one every 2 s), and for WhatsApp, which paces no
   chat (its pair limit allows bursts and is met as a flood), the number's throughput of
   80 a second; for Messenger and Instagram, which pace no chat either, the Send API's 300
   a second per Page and 100 per Instagram account. Figure: rows delivered per second (the ledger's `delivered_at`, first to
   last) against that ceiling, the 429s the fake answered, beside Telegram's ratio.

A platform is one class below and one entry of ROWS: a `Row` with its fakes, its channel
settings, how its inbound arrives (`loadgen_kind` and its bodies in
tests/bench/loadgen.bodies, or `push` for a connection) and its ceiling into one chat.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack

WARMUP = 200
WINDOW_SECONDS = 4.0
ROUNDS = 2
CONNECTION_BURST = 1500
DRAIN_SECONDS = 15.0
# How long the drains get once the worker is up: a platform whose sends are still owed then
# (WhatsApp's transport waits 60 s after a throughput error) is reported with what it
# delivered by then, the bench not waiting that wait out.
DRAIN_WAIT = 45.0
# Replies owed to one chat at most: the ledger's sweep claims from the oldest 500 open rows
# (delivery.ledger.claim_due), so a chat owed more would hold every later row back.
DRAIN_MOST = 400
NAME = "platforms"
COMMAND = ".venv/bin/python -m tests.bench platforms"
# Windows long enough that nothing flushes while a connection platform's burst is measured
# (its worker runs): what is measured is admission alone, as for the webhooks.
QUIET = {"window_closed": 60, "window_greeting": 60, "window_open": 60, "window_neutral": 60,
         "window_media": 60, "window_album": 60, "max_wait": 300, "typing_mode": "never"}


class Row:
    name = ""
    kind = ""
    slug = ""
    loadgen_kind = ""  # a webhook platform: tests.bench.loadgen --kind; "" for a connection (push)
    ceiling = 1.0  # the platform's documented sends/s into one chat
    ceiling_says = ""
    drain_chat = ""
    drains = True  # measured in the paced drain too
    push_says = ""  # a connection platform: how its inbound arrives, for the report

    def start(self, stack):
        """Its fakes started on `stack`, keeping the platform's documented limits."""
        raise NotImplementedError

    def settings(self):
        raise NotImplementedError

    def headers(self):
        """loadgen --header lines every request carries."""
        return []

    def secret(self):
        """What loadgen signs each request with (--secret), if the platform signs them."""
        return ""

    def floods(self):
        """The sends the fake answered 429 (or the platform's own rate-limit error)."""
        raise NotImplementedError

    def send_times(self):
        """[(time.monotonic() of each send the fake got, refused?)] (BENCH_TIMELINE)."""
        return []

    def ready(self, channel):
        """Whether the worker is ready to take this platform's inbound (a connection's session)."""
        return True

    def push(self, first, count):
        """A connection platform: `count` messages from message number `first` on, each in
        one of 200 DMs, sent by the platform's fake."""
        raise NotImplementedError


class Telegram(Row):
    name, kind, slug, loadgen_kind = "Telegram", "telegram", "b-tg", "telegram"
    ceiling, ceiling_says = 1.0, "1 message/s into a chat"
    drain_chat = "7000001"
    SECRET, TOKEN = "bench-secret", "5:BENCH-PLATFORMS"

    def start(self, stack):
        from tests.fakes.telegram_api import FakeBotAPI, Limits

        self.fake = stack.enter_context(FakeBotAPI(limits=Limits()))
        self.fake.add_token(self.TOKEN)

    def settings(self):
        return {"bot_token": self.TOKEN, "webhook_secret": self.SECRET, "api_base": self.fake.url}

    def headers(self):
        return [f"X-Telegram-Bot-Api-Secret-Token: {self.SECRET}"]

    def send_times(self):
        return flagged([c.at for c in self.fake.calls("sendMessage")], self.fake.flood_times)

    def floods(self):
        return self.fake.floods


class WhatsApp(Row):
    name, kind, slug, loadgen_kind = "WhatsApp", "whatsapp", "b-wa", "whatsapp"
    ceiling, ceiling_says = 80.0, "80 messages/s per number (no chat paced)"
    drain_chat = "5491100000001"

    def start(self, stack):
        from tests.fakes.graph_api import FakeGraphAPI

        self.fake = stack.enter_context(FakeGraphAPI(per_second=80))

    def settings(self):
        from tests.support.whatsapp import whatsapp_settings

        return whatsapp_settings(self.fake)

    def secret(self):
        from tests.support.whatsapp import APP_SECRET

        return APP_SECRET

    def floods(self):
        return self.fake.floods

    def send_times(self):
        return flagged([c.at for c in self.fake.calls("message")], self.fake.flood_times)


class Slack(Row):
    name, kind, slug, loadgen_kind = "Slack", "slack", "b-sl", "slack"
    ceiling, ceiling_says = 1.0, "about 1 message/s into a channel"
    drain_chat = "D0BENCHDRN"

    def start(self, stack):
        from tests.fakes.slack_api import FakeSlackAPI

        self.fake = stack.enter_context(FakeSlackAPI(channel_interval=1.0))

    def settings(self):
        from tests.support.slack import slack_settings

        return slack_settings(self.fake)

    def secret(self):
        from tests.support.slack import SIGNING_SECRET

        return SIGNING_SECRET

    def floods(self):
        return self.fake.floods

    def send_times(self):
        return flagged([c.at for c in self.fake.calls("chat.postMessage")], self.fake.flood_times)


class Discord(Row):
    name, kind, slug = "Discord", "discord", "b-dc"
    push_says = "MESSAGE_CREATE over the Gateway into the worker's connection"
    ceiling, ceiling_says = 1.0, "5 messages per 5 s into a channel"
    drain_chat = "610000000000000001"
    TOKEN = "discord-bench-t0ken"

    def start(self, stack):
        from tests.fakes.discord_api import DiscordGateway, DiscordRest

        self.gateway = stack.enter_context(DiscordGateway(self.TOKEN, heartbeat_ms=5000))
        self.rest = stack.enter_context(DiscordRest(self.TOKEN, self.gateway.url))

    def settings(self):
        return {"bot_token": self.TOKEN, "api_base": self.rest.url}

    def floods(self):
        return sum(1 for status, body in self.rest.refused if status == 429 and body is not None)

    def send_times(self):
        return [(at, False) for at in self.rest.sent_at]

    def ready(self, channel):
        channel.refresh_from_db(fields=["poll_session"])
        return self.gateway.connected() and bool(channel.poll_session)

    def push(self, first, count):
        from tests.fakes.discord_api import message

        self.gateway.dispatch_many("MESSAGE_CREATE", [
            message(str(800_000_000_000_000_000 + i), str(620_000_000_000_000_000 + i % 200), f"mensaje {i} y",
                    author=str(630_000_000_000_000_000 + i % 200)) for i in range(first, first + count)])


class GoogleChat(Row):
    name, kind, slug, loadgen_kind = "Google Chat", "google_chat", "b-gc", "google_chat"
    ceiling, ceiling_says = 1.0, "60 writes/min a space, kept as 1/s"
    drain_chat = "spaces/DMBENCHDRAIN"

    def start(self, stack):
        from tests.fakes.google_chat_api import FakeGoogleChat

        self.fake = stack.enter_context(FakeGoogleChat())

    def settings(self):
        from tests.support.google_chat import google_chat_settings

        return google_chat_settings(self.fake)

    def headers(self):
        return [f"Authorization: Bearer {self.fake.chat_token()}"]  # Chat's token lives an hour

    def floods(self):
        return len(self.fake.refused())

    def send_times(self):
        refused = {id(c) for c in self.fake.refused()}
        return [(c.at, id(c) in refused) for c in self.fake.calls("create")]


from tests.bench.matrix_row import Matrix  # noqa: E402 -- a Row of its own module (through a real Synapse)
from tests.bench.platforms_email import Email  # noqa: E402 -- its Row subclass needs Row above
from tests.bench.platforms_rows import Instagram, Messenger, Sms, Teams  # noqa: E402 -- Rows of their own module

ROWS = [Telegram, WhatsApp, Slack, Discord, GoogleChat, Teams, Messenger, Instagram, Sms, Matrix, Email]  # the first is the reference


def bench_platforms(kit):
    """`BENCH_PLATFORMS=slack,discord`: those beside Telegram only; `BENCH_PLATFORMS_PARTS=drain`
    (or `inbound`): one half only."""
    from django.core.management import call_command

    chosen = os.environ.get("BENCH_PLATFORMS", "").lower().split(",")
    parts = os.environ.get("BENCH_PLATFORMS_PARTS", "inbound,drain").split(",")
    with ExitStack() as stack:
        rows = [row() for row in ROWS if row is ROWS[0] or not chosen[0] or row.kind in chosen]
        for row in rows:
            row.start(stack)
        intake, drains = {}, {}
        if "inbound" in parts:
            intake.update(webhook_intake(kit, [r for r in rows if r.loadgen_kind]))
            call_command("flush", interactive=False, verbosity=0)
            for row in rows:
                if not row.loadgen_kind:
                    intake[row.name] = row.intake(kit, channel, QUIET) if hasattr(row, "intake") else \
                        connection_intake(kit, row)
                    call_command("flush", interactive=False, verbosity=0)
        if "drain" in parts:
            drains = paced_drains(kit, [row for row in rows if row.drains])
    report(kit, rows, intake, drains)


def channel(row, **fields):
    from conversations.models import Channel

    return Channel.objects.create(slug=row.slug, kind=row.kind, platform_settings=row.settings(), **fields)


def webhook_intake(kit, rows):
    """{platform: (median accepted POSTs/s, the rounds' figures)}."""
    for row in rows:
        channel(row, **QUIET)
    web, base = kit.web_server()
    rounds = {row.name: [] for row in rows}
    try:
        for row in rows:
            run(kit, base, row, "--n", str(WARMUP), offset=0)
        for r in range(ROUNDS):
            for row in rows:
                rounds[row.name].append(run(kit, base, row, "--seconds", str(WINDOW_SECONDS),
                                            offset=(r + 1) * 100_000))
    finally:
        kit.stop(web)
    return {name: (statistics.median(x["rate"] for x in runs), runs) for name, runs in rounds.items()}


def run(kit, base, row, *how, offset):
    """One loadgen process against `row`'s webhook; its JSON figures."""
    args = [sys.executable, "-m", "tests.bench.loadgen", "--url", f"{base}/webhooks/{row.kind}/{row.slug}/",
            "--kind", row.loadgen_kind, "--offset", str(offset), "--concurrency", "16", *how]
    if row.secret():
        args += ["--secret", row.secret()]
    for header in row.headers():
        args += ["--header", header]
    out = subprocess.run(args, cwd=kit.BASE_DIR, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def connection_intake(kit, row, burst=CONNECTION_BURST):
    """(messages admitted/s in the burst's steady part, [its figures]) for a connection platform."""
    from conversations.models import InboundMessage

    found = channel(row, **QUIET)
    proc = kit.worker()
    try:
        kit.wait_until(lambda: row.ready(found), 30, f"{row.name}'s session")
        admitted = InboundMessage.objects.filter(channel=found)
        row.push(0, WARMUP)
        kit.wait_until(lambda: admitted.count() >= WARMUP, 60, f"{row.name}'s warm-up admitted")
        began = time.monotonic()
        row.push(WARMUP, burst)
        kit.wait_until(lambda: admitted.count() >= WARMUP + burst, 120, f"{row.name}'s burst admitted")
        wall = time.monotonic() - began
        stamps = sorted(admitted.order_by("pk").values_list("received_at", flat=True)[WARMUP:])
    finally:
        kit.stop(proc)
    rate = admitted_rate(stamps)
    return rate, [{"rate": rate, "n": burst, "wall": wall, "errors": WARMUP + burst - admitted.count()}]


def admitted_rate(stamps):
    """Messages admitted a second over their `received_at` stamps, the first tenth left out
    (the steady state, not the start)."""
    skip = len(stamps) // 10
    seconds = (stamps[-1] - stamps[skip]).total_seconds()
    return (len(stamps) - 1 - skip) / seconds if seconds > 0 else 0.0


def paced_drains(kit, rows):
    """{platform: (rows owed, delivered, per second, seconds, 429s, labelled)}: every platform's drain at once,
    one worker, each into one chat of its own channel at the platform's default pacing."""
    from django.utils import timezone

    from conversations.models import Contact, Conversation
    from delivery import ledger
    from delivery.models import OutboundKind, OutboundMessage, OutboundState

    owed = {}
    for row in sorted(rows, key=lambda row: row.ceiling):  # the longest drain's rows last
        found = channel(row)
        contact = Contact.objects.create(channel=found, platform_id=row.drain_chat)
        conversation = Conversation.objects.create(channel=found, contact=contact, chat_id=row.drain_chat,
                                                   sender_id=row.drain_chat)
        n = min(DRAIN_MOST, max(10, round(row.ceiling * DRAIN_SECONDS)))
        ledger.enqueue_many([ledger.Reply(conversation, f"reply {i}", OutboundKind.REPLY) for i in range(n)])
        owed[row.name] = (found, n, row.floods())
    total = sum(n for _, n, _ in owed.values())
    began = time.monotonic()
    proc = kit.worker()
    try:
        delivered = OutboundMessage.objects.filter(state=OutboundState.DELIVERED)
        end = time.monotonic() + DRAIN_WAIT
        while delivered.count() < total and time.monotonic() < end:
            time.sleep(0.2)
        ended = timezone.now()
    finally:
        kit.stop(proc)
    if os.environ.get("BENCH_TIMELINE"):
        timeline(rows, began)
    drains = {}
    for row in rows:
        found, n, floods_before = owed[row.name]
        stamps = sorted(delivered.filter(channel=found).values_list("delivered_at", flat=True))
        if len(stamps) == n:  # first send to last
            seconds = (stamps[-1] - stamps[0]).total_seconds()
            rate = (n - 1) / seconds if seconds > 0 else 0.0
        else:  # what went from its first send until the bench stopped waiting
            seconds = (ended - stamps[0]).total_seconds() if stamps else DRAIN_WAIT
            rate = len(stamps) / seconds
        labelled = delivered.filter(channel=found, needs_marker=True).count()
        drains[row.name] = (n, len(stamps), rate, seconds, row.floods() - floods_before, labelled)
    return drains


def report(kit, rows, intake, drains):
    from tests.bench import targets

    database = os.environ["DATABASE_URL"].split(":", 1)[0]
    database = {"postgres": "PostgreSQL", "postgresql": "PostgreSQL", "sqlite": "SQLite"}.get(database, database)
    ref = rows[0].name
    for row in rows if intake else ():
        ref_in = intake[ref][0]
        rate, runs = intake[row.name]
        how = (f"signed webhook POSTs, 16 clients, median of {len(runs)} x {WINDOW_SECONDS:g} s after a "
               f"{WARMUP}-request warm-up" if row.loadgen_kind else
               f"{row.push_says}, {runs[0]['n']} after a "
               f"{WARMUP}-message warm-up, the first tenth not counted")
        errors = sum(r["errors"] for r in runs)
        kit.report(NAME, f"{row.name:<11} inbound {rate:6.0f} accepted/s ({how}; {errors} not accepted) vs "
                         f"Telegram {ref_in:.0f}/s: ratio {rate / ref_in:.2f}")
    for row in [row for row in rows if row.name in drains]:
        ref_share = drains[ref][2] / rows[0].ceiling
        n, sent, per_second, seconds, floods, labelled = drains[row.name]
        share = per_second / row.ceiling
        what = (f"{n} replies in {seconds:.1f} s" if sent == n else
                f"{sent} of {n} replies delivered in {seconds:.1f} s, the rest still owed when the bench stopped waiting")
        kit.report(NAME, f"{row.name:<11} paced drain into one chat: {what} = {per_second:.2f}/s vs its ceiling "
                         f"{row.ceiling:g}/s ({row.ceiling_says}): {share:.2f} of it, {floods} 429s, {labelled} labelled; "
                         f"Telegram "
                         f"{ref_share:.2f} of its ceiling: ratio {share / ref_share:.2f}")
        if row is not rows[0]:
            targets.record(NAME, database, f"{row.name} paced drain into one chat, as a share of its ceiling, "
                                           f">= 0.9x Telegram's in the same run (this bench's own bar)",
                           share >= 0.9 * ref_share and sent == n,
                           f"{share / ref_share:.2f}x ({share:.2f} vs {ref_share:.2f} of the ceiling; {sent} of {n} "
                           f"delivered, {floods} 429s)")
    kit.report(NAME, f"reproduce with: {COMMAND}  (on PostgreSQL: DATABASE_URL=… {COMMAND})")


def flagged(calls, floods):
    """[(call time, refused?)]: a call is refused if a flood was stamped within 10 ms after it."""
    return [(at, any(0 <= f - at < 0.01 for f in floods)) for at in calls]


def timeline(rows, began):
    """BENCH_TIMELINE=1: each drain's sends as its fake saw them (seconds from the worker's start; * a 429)."""
    for row in rows:
        sends = row.send_times()
        if len(sends) <= 40:
            print(f"  {row.name:<11} " + " ".join(f"{at - began:.2f}{'*' if refused else ''}" for at, refused in sends))
            continue
        seconds = {}
        for at, refused in sends:
            counted = seconds.setdefault(int(at - began), [0, 0])
            counted[refused] += 1
        print(f"  {row.name:<11} per second (sent/refused): " + " ".join(f"{s}s:{ok}/{no}" for s, (ok, no)
                                                                       in sorted(seconds.items())))
