"""One product on several hosts, and hosts that fail (issue 15).

scripts/cluster.sh builds the hosts as network namespaces on this machine: `db`
(PostgreSQL, Redis), `app-a` (web server, worker loop, django-q2's cluster) and `app-b`
(web server, worker loop), each app host on a link of its own to db. From the root
namespace, for 40 s, about 30 Telegram webhook POSTs a second over 300 conversations,
half through each web host; replies go to a local Bot API on the bridge (each sendMessage
taking 0.2 s, as a real round trip does); every 5th message asks the agent for a booking,
a guarded calendar_create_event. Meanwhile:

- at 12 s every process on app-a is killed with SIGKILL; at 27 s they are started again;
- at 31 s app-b loses its link to db for 5 s (`ip link set db0 down`, then up).

Checks: no accepted message lost (every POST answered 2xx is in a turn), every message
answered (its reply, or the notice of a turn its dead worker had started acting in), no
reply sent twice without the ♻️ Recovered label, no booking made twice, every
conversation answered. Figures: seconds until what app-a held (its running turns, the
ledger rows it was sending or had to send, its conversations' open buffers) is taken
over by app-b, and messages/s before and after.

Root only (skipped otherwise); run once, in the PostgreSQL pass of `make test`. By hand:

    sudo DATABASE_URL=postgres://… .venv/bin/python -m pytest tests/end_to_end/test_cluster_faults.py -s
"""

import asyncio
import importlib.util
import json
import os
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection

from conversations.engine import RECOVERY_NOTICE
from delivery.ledger import RECOVERY_PREFIX
from tests.cluster import load
from tests.cluster.hosts import Cluster
from tests.cluster.readback import Readback, Takeover
from tests.fakes.telegram_api import FakeBotAPI

pytestmark = pytest.mark.e2e

SLUG, TOKEN, SECRET = "cluster", "7100:CLUSTER-TEST", "cluster-secret"
# 40 s, not the 60 s it once ran (issue 23: the suite in 15 minutes): 7 s of steady
# state before the kill, app-a down for the same 15 s (longer than a heartbeat-only
# takeover's 7-8 s, so `limit` below holds without the liveness lock too), 4 s after the cut.
RATE, SECONDS, CONVERSATIONS, BOOK_EVERY = 30.0, 40.0, 300, 5
KILL_AT, RESTART_AT, UNPLUG_AT, UNPLUG_FOR = 12.0, 27.0, 31.0, 5.0
AGENT_DELAY = 1.0  # seconds a turn thinks: app-a dies holding running turns
SEND_DELAY = 0.2  # seconds each sendMessage takes at the local Bot API: rows mid-send at the kill
DRAIN_TIMEOUT = 60.0
TAKEOVER_TARGET = 5.0
# Without fast death detection (conversations/liveness.py), a dead host's worker is
# noticed when its heartbeat is older than this (the default is 30 s).
STALE_AFTER_WITHOUT_LIVENESS = 10.0
PHASES = {f"before (5-{KILL_AT:g} s)": (5.0, KILL_AT),
          f"app-a down ({KILL_AT:g}-{RESTART_AT:g} s)": (KILL_AT, RESTART_AT),
          f"app-b cut from db ({UNPLUG_AT:g}-{UNPLUG_AT + UNPLUG_FOR:g} s)": (UNPLUG_AT, UNPLUG_AT + UNPLUG_FOR),
          f"after ({UNPLUG_AT + UNPLUG_FOR:g}-{SECONDS:g} s)": (UNPLUG_AT + UNPLUG_FOR, SECONDS)}


def has_liveness():
    """Fast death detection from the database itself, unless switched to the heartbeat."""
    return (importlib.util.find_spec("conversations.liveness") is not None
            and os.environ.get("AGENTLOOP_LIVENESS", "").lower() != "heartbeat")


def skip_reason():
    if connection.vendor != "postgresql":
        return "the cluster test runs once, in the PostgreSQL pass"
    if os.geteuid() != 0:
        return "the cluster test needs root (network namespaces, a bridge, veth links): run make test as root"
    reason = Cluster().unavailable()
    return f"the cluster cannot be built here: {reason}" if reason else ""


@pytest.fixture
def cluster(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    env = {"AGENTLOOP_EXTRA_AGENTS": "cluster=tests.cluster.agent.ClusterAgent"}
    if not has_liveness():
        env["AGENTLOOP_WORKER_STALE_AFTER"] = str(STALE_AFTER_WITHOUT_LIVENESS)
    with Cluster(env=env).running(tmp_path / "cluster-logs") as hosts:
        yield hosts


@pytest.fixture
def bot_api(cluster):
    """The local Bot API on the bridge, where both app hosts reach it."""
    with FakeBotAPI(host=cluster.root_address) as fake:
        fake.delay("sendMessage", SEND_DELAY)
        yield fake


def add_channel(cluster, bot_api):
    """The load's Telegram channel, its agent the scripted one that books."""
    cluster.manage("addchannel", SLUG, "--kind", "telegram", "--token", TOKEN, "--secret", SECRET,
                   "--api-base", bot_api.url, "--mode", "webhook", "--agent", "cluster",
                   # Unpaced: its Bot API keeps no limits; one budget across processes has a
                   # test of its own (test_paced_drain, two workers on PostgreSQL).
                   "--messages-per-second", "0", "--chat-interval", "0", "--group-messages-per-minute", "0",
                   "--agent-config", json.dumps({"delay": AGENT_DELAY}), "--typing-mode", "never",
                   AGENTLOOP_EXTRA_AGENTS="cluster=tests.cluster.agent.ClusterAgent")


def test_hosts_die_and_lose_the_database_under_load(cluster, bot_api, tmp_path, capsys):
    add_channel(cluster, bot_api)
    db = Readback(cluster.database_url, SLUG)
    messages = load.plan(RATE, SECONDS, CONVERSATIONS, hosts=2, book_every=BOOK_EVERY)
    app_a_chats = {m.chat for m in messages if m.home == 0}
    takeover = Takeover(db, "app-a", app_a_chats)
    started, started_wall = time.monotonic(), time.time()
    faults = Faults(cluster, takeover, started)
    faults.start()
    asyncio.run(load.run([cluster.web_url("app-a"), cluster.web_url("app-b")], SLUG, SECRET, messages,
                         started=started))
    faults.join(timeout=60)  # the restart is bounded by cluster.sh's own deadlines
    settled = drain(db)
    time.sleep(2.0)  # a late second copy of a reply would arrive now
    takeover.finish()

    figures = measure(db, bot_api, messages, takeover, started, settled)
    figures["flush_lateness_seconds"] = db.flush_lateness(
        {name: (started_wall + start, started_wall + end) for name, (start, end) in PHASES.items()})
    report(figures, tmp_path, capsys)
    assert not faults.is_alive() and faults.errors == [], faults.errors
    assert figures["unsettled_after_drain"] == {"open_buffers": 0, "active_turns": 0, "open_ledger_rows": 0}, figures
    assert figures["not_accepted"] == 0, figures  # each was delivered again until a host took it
    assert figures["lost"] == [], figures
    assert figures["unanswered"] == [], figures
    assert figures["conversations_unanswered"] == 0, figures
    assert figures["unlabelled_duplicate_replies"] == 0, figures
    assert figures["duplicate_effects"] == {"claims_done_twice": 0, "events_made_twice": 0}, figures
    assert takeover.turns, "app-a ran no turn when it died: the test proves nothing"
    limit = TAKEOVER_TARGET if has_liveness() else RESTART_AT - KILL_AT
    for kind, held in (("turns", takeover.turns), ("ledger", takeover.rows)):
        seconds = figures["takeover_seconds"][kind]
        assert not held or (seconds is not None and seconds <= limit), (kind, figures)
    # Taken over by app-b: app-a was started again only after the limit.
    assert set(figures["taken_by"]["turns run again"]) <= {"app-b"}, figures
    assert set(figures["taken_by"]["ledger rows sent"]) <= {"app-b"}, figures


class Faults(threading.Thread):
    """The fault schedule, against the load's clock."""

    def __init__(self, cluster, takeover, started):
        super().__init__(name="faults", daemon=True)
        self.cluster, self.takeover, self.started = cluster, takeover, started
        self.errors = []

    def at(self, seconds):
        time.sleep(max(0.0, self.started + seconds - time.monotonic()))

    def run(self):
        try:
            self.at(KILL_AT)
            self.takeover.snapshot()
            self.takeover.killed(time.time())  # timed from the kill, not from its end
            self.cluster.kill("app-a")
            self.takeover.watch(timeout=RESTART_AT - KILL_AT + 10)
            self.at(RESTART_AT)
            self.cluster.start("app-a")
            self.at(UNPLUG_AT)
            self.cluster.unplug("app-b")
            self.at(UNPLUG_AT + UNPLUG_FOR)
            self.cluster.plug("app-b")
        except Exception as error:  # reported by the test, after the load
            self.errors.append(repr(error))
            try:
                self.cluster.plug("app-b")
            except Exception as again:
                self.errors.append(repr(again))


def drain(db):
    """Wait (bounded) until every buffer is flushed, every turn finished, every ledger row final."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    began = time.monotonic()
    while True:
        unsettled = db.unsettled()
        if not any(unsettled.values()) or time.monotonic() > deadline:
            return {"after_seconds": round(time.monotonic() - began, 1), **unsettled}
        time.sleep(0.5)


def measure(db, bot_api, messages, takeover, started, settled):
    sent = [c for c in bot_api.calls("sendMessage", token=TOKEN)]
    by_chat = defaultdict(list)
    for call in sent:
        by_chat[int(call.params["chat_id"])].append(call.params["text"])
    accepted = [m for m in messages if m.accepted_at is not None]
    admitted = db.messages()

    lost, unanswered, notices = [], [], 0
    for m in accepted:
        disposition, turn, state = admitted.get(m.platform_id, (None, None, None))
        if turn is None:
            lost.append((m.platform_id, disposition))
            continue
        texts = by_chat[m.chat]
        if state == "done" and any(m.text in t for t in texts):
            continue
        if state == "failed" and any(str(RECOVERY_NOTICE) in t for t in texts):
            notices += 1
            continue
        unanswered.append((m.platform_id, state))

    # A reply sent more often (unlabelled) than the ledger holds it is a duplicate nobody was told of.
    plain = Counter((str(c.params["chat_id"]), c.params["text"]) for c in sent
                    if not c.params["text"].startswith(RECOVERY_PREFIX))
    rows = db.ledger_rows()
    unlabelled = sum(max(0, n - rows.get(key, 0)) for key, n in plain.items())
    labelled = sum(1 for c in sent if c.params["text"].startswith(RECOVERY_PREFIX))

    replies_at = [c.at - started for c in sent]

    def replies_rate(start, end):
        return round(sum(1 for t in replies_at if start <= t < end) / (end - start), 1)

    lateness, flushed_by = db.buffer_lateness(takeover.buffers, takeover.killed_at, takeover.dead)
    return {
        "messages": len(messages), "accepted": len(accepted), "not_accepted": len(messages) - len(accepted),
        "accepted_by": dict(Counter(["app-a", "app-b"][m.host] for m in accepted)),
        "failed_over": sum(1 for m in accepted if m.host != m.home),
        "failed_posts": dict(Counter(f"{['app-a', 'app-b'][host]} {outcome}" for m in messages
                                     for host, outcome, *_ in m.tries if not (isinstance(outcome, int) and outcome < 300))),
        "lost": lost, "unanswered": unanswered, "answered_by_notice": notices,
        "conversations_unanswered": len({m.chat for m in accepted} - set(by_chat)),
        "unlabelled_duplicate_replies": unlabelled, "labelled_resends": labelled,
        "duplicate_effects": db.duplicate_effects(), "effects": db.effects(),
        "takeover_seconds": {k: (round(v, 2) if v is not None else None) for k, v in takeover.seconds.items()},
        "taken_by": {k: dict(v) if isinstance(v, Counter) else v for k, v in takeover.taken_by.items()},
        "app_b_turns_let_go": db.let_go("app-b"),
        "held_at_kill": {"turns": len(takeover.turns), "ledger_rows": len(takeover.rows),
                         "open_buffers": len(takeover.buffers)},
        "buffers_latest_flush_after_due": round(lateness, 2) if lateness is not None else None,
        "buffers_flushed_by": dict(flushed_by),
        "death_detection": "conversations.liveness" if has_liveness()
        else f"heartbeat (AGENTLOOP_WORKER_STALE_AFTER={STALE_AFTER_WITHOUT_LIVENESS:g})",
        "accepted_per_second": {name: round(load.accepted_rate(messages, start, end), 1)
                                for name, (start, end) in PHASES.items()},
        "replies_per_second": {name: replies_rate(start, end) for name, (start, end) in PHASES.items()},
        "turns": db.turn_states(), "ledger": db.ledger_states(),
        "drained": settled, "unsettled_after_drain": {k: v for k, v in settled.items() if k != "after_seconds"},
    }


def report(figures, tmp_path, capsys):
    """The figures, on the terminal (past pytest's capture) and as JSON beside the logs."""
    (tmp_path / "cluster-figures.json").write_text(json.dumps(figures, indent=1, default=str))
    t, held = figures["takeover_seconds"], figures["held_at_kill"]
    lines = [
        "",
        "cluster fault test (scripts/cluster.sh; tests/end_to_end/test_cluster_faults.py)",
        f"  load: {figures['messages']} messages over {CONVERSATIONS} conversations at {RATE:g}/s for {SECONDS:g} s, "
        f"half through each web host; accepted {figures['accepted']} ({figures['failed_over']} by the other host "
        f"after a failed POST): {figures['accepted_by']}; failed POSTs {figures['failed_posts']}",
        f"  faults: app-a SIGKILLed at {KILL_AT:g} s, started at {RESTART_AT:g} s; app-b cut from db "
        f"{UNPLUG_AT:g}-{UNPLUG_AT + UNPLUG_FOR:g} s",
        f"  lost {len(figures['lost'])}, unanswered {len(figures['unanswered'])} (answered by the recovery notice: "
        f"{figures['answered_by_notice']}), conversations unanswered {figures['conversations_unanswered']}, "
        f"unlabelled duplicate replies {figures['unlabelled_duplicate_replies']} (labelled resends "
        f"{figures['labelled_resends']}), duplicate effects {figures['duplicate_effects']} ({figures['effects']})",
        f"  takeover by app-b ({figures['death_detection']}): turns {t['turns']} s ({held['turns']} running at the "
        f"kill), ledger rows {t['ledger']} s ({held['ledger_rows']} held), open buffers {held['open_buffers']}: "
        f"latest flushed {figures['buffers_latest_flush_after_due']} s after due, by {figures['buffers_flushed_by']}; "
        f"{figures['taken_by']}",
        f"  app-b's turns it let go of or had taken from it (cut from db): {figures['app_b_turns_let_go']}",
        f"  accepted messages/s: {figures['accepted_per_second']}",
        f"  replies/s: {figures['replies_per_second']}",
        f"  flushes after their deadlines (s): {figures['flush_lateness_seconds']}",
        f"  turns {figures['turns']}, ledger {figures['ledger']}, drained in {figures['drained']['after_seconds']} s",
    ]
    with capsys.disabled():  # so `make test` shows them
        print("\n".join(lines), flush=True)
