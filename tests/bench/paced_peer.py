"""What a person waits for at a steady rate, agentloop beside the peer (issue 57): the peer
benchmark's systems (tests/bench/peer.py: agentloop as `make run` starts it on SQLite and
on PostgreSQL, the Chat SDK bot on memory and on Redis state; the echo agent, the local
Bot API, pacing off) under a paced load (open loop: message i due at start + i / rate,
whatever the system answers), at rates stepping up by STEP_UP.

Both systems wait the same window after a message (1.5 s: the peer's debounce, and
agentloop's open window in this benchmark; peer.PEER_DEBOUNCE), so the seconds past it are
the systems', not their designs'. Half the messages open a chat; the other half come back
to a chat first seen RETURN_AFTER seconds before (its first turn long answered: a turn of
its own). The first LEAD_IN seconds of a step open chats only: answered, not judged.

Per step: the reply latency from the message's due time to its reply's sendMessage at the
Bot API (a client falling behind counts against the system), p50 and p99, and the share
answered within the window + 1 s. A step is *kept whole* when KEPT_SHARE of its messages
are answered within the window + 1 s and none is missing or doubled. A system steps up
while it keeps each step, and on past its first miss until the highest rate any system
before it kept (the peers run first), so every system has a row at the peer's kept rate.

Issue 57's targets: the kept-whole rate >= 1.5x the peer's best configuration's on SQLite
and >= 1.2x on PostgreSQL; at the peer's kept rate, agentloop's reply p99 <= the peer's;
PostgreSQL's kept-whole rate >= 0.8x SQLite's.

    .venv/bin/python -m tests.bench peer-paced
"""

import shutil
from contextlib import closing

from tests.bench import peer, targets
from tests.bench.loadgen import percentile
from tests.bench.sustained import FrozenHistory, all_answered, lead_count, paced, reply_latencies

FIRST_RATE = 150.0  # messages/s of the first step
STEP_UP = 1.25
MAX_RATE = 2000.0
STEP_SECONDS = 15.0  # judged, after the lead-in
RETURN_AFTER = 4.0  # seconds between a chat's first message and its second: window + its reply, and more
LEAD_IN = RETURN_AFTER
KEPT_SHARE = 0.99  # of a step's messages answered within the window + 1 s
WITHIN_BEYOND_WINDOW = 1.0
DRAIN_TIMEOUT = 90.0  # seconds a step's last replies may take before it is judged with them missing
NAN = float("nan")


def ladder():
    rate, rates = FIRST_RATE, []
    while rate <= MAX_RATE:
        rates.append(round(rate))
        rate *= STEP_UP
    return rates


def step(system, fake, offset, rate):
    """One paced step at `rate`: its figures, judged after the lead-in."""
    run = paced(system, offset, rate, STEP_SECONDS, STEP_SECONDS, return_after=RETURN_AFTER, lead_in=LEAD_IN)
    all_answered(fake, system.token, run, offset, DRAIN_TIMEOUT)
    latency, missing, doubled = reply_latencies(fake, system.token, run, offset)
    lead = lead_count(run)
    judged = sum(run["per_client"]) - lead
    waits = sorted(seconds for i, seconds in latency.items() if i >= lead)
    bound = system.window + WITHIN_BEYOND_WINDOW
    within = sum(1 for seconds in waits if seconds <= bound) / max(judged, 1)
    return {"rate": rate, "accepted_rate": run["n"] / (LEAD_IN + STEP_SECONDS), "errors": run["errors"],
            "p50": percentile(waits, 50, NAN), "p99": percentile(waits, 99, NAN), "within": within,
            "missing": missing, "doubled": doubled,
            "kept": within >= KEPT_SHARE and not missing and not doubled and not run["errors"]}


def climb(system, fake, offset, report, up_to=0.0):
    """Steps up the ladder while kept, and on until `up_to` whatever; the steps' figures."""
    steps = []
    peer.post_updates(system, peer.WARMUP, offset)
    peer.wait_answered(fake, system.token, peer.chats(peer.WARMUP, offset), peer.ANSWER_TIMEOUT)
    for n, rate in enumerate(ladder()):
        figures = step(system, fake, offset + (n + 1) * peer.SPAN, rate)
        steps.append(figures)
        report("peer-paced", f"  {system.name:<38} {row(figures)}")
        if not figures["kept"] and rate >= up_to:
            break
    return steps


def row(f):
    return (f"{f['rate']:5.0f}/s  accepted {f['accepted_rate']:5.0f}/s  reply p50 {f['p50']:5.2f} s  p99 "
            f"{f['p99']:5.2f} s  within the window + {WITHIN_BEYOND_WINDOW:g} s {f['within']:6.1%}  "
            f"{'kept whole' if f['kept'] else 'NOT kept'}"
            + (f" ({f['missing']} missing, {f['doubled']} doubled, {f['errors']} errors)"
               if f["missing"] or f["doubled"] or f["errors"] else ""))


def kept_rate(steps):
    """The highest rate kept whole below the first step that was not (0 if none was)."""
    kept = 0.0
    for figures in steps:
        if not figures["kept"]:
            break
        kept = figures["rate"]
    return kept


def at_rate(steps, rate):
    return next((figures for figures in steps if figures["rate"] == rate), None)


def ratio(a, b):
    return a / b if b else float("inf")


def record(ours, peers, by_database):
    """Issue 57's paced targets for one agentloop database."""
    best = max(peers, key=lambda system: system["kept"])
    db, kept = ours["database"], ours["kept"]
    wanted = 1.5 if db == "SQLite" else 1.2
    targets.record("peer-paced", db, f"kept-whole rate >= {wanted:g}x the peer's best",
                   ratio(kept, best["kept"]) >= wanted,
                   f"{ratio(kept, best['kept']):.2f}x ({kept:.0f} vs {best['kept']:.0f}/s, {best['name']})")
    mine, theirs = at_rate(ours["steps"], best["kept"]), at_rate(best["steps"], best["kept"])
    if mine and theirs:
        targets.record("peer-paced", db, "reply p99 at the peer's kept rate <= the peer's", mine["p99"] <= theirs["p99"],
                       f"{mine['p99']:.2f} vs {theirs['p99']:.2f} s at {best['kept']:.0f}/s (both a "
                       f"{ours['window']:g} s window)")
    if db == "PostgreSQL" and "SQLite" in by_database:
        sqlite = by_database["SQLite"]["kept"]
        targets.record("peer-paced", db, "kept-whole rate >= 0.8x SQLite's", ratio(kept, sqlite) >= 0.8,
                       f"{ratio(kept, sqlite):.2f}x ({kept:.0f} vs {sqlite:.0f}/s)")


def bench_peer_paced(report=print):
    from tests.fakes.telegram_api import FakeBotAPI

    if not shutil.which("node"):
        report("peer-paced", "skipped: `node` is missing (install Node.js 20+ to compare with the Chat SDK peer)")
        return
    peer.ensure_node_modules()
    report("peer-paced", f"paced steps from {FIRST_RATE:g}/s, x{STEP_UP:g} each, {STEP_SECONDS:g} s judged after a "
                         f"{LEAD_IN:g} s lead-in, half the messages returning to a chat {RETURN_AFTER:g} s later; "
                         f"reply latency from each message's due time; kept whole: {KEPT_SHARE:.0%} within the "
                         f"window + {WITHIN_BEYOND_WINDOW:g} s, none missing")
    systems, offset, highest = [], 0, 0.0
    with FakeBotAPI() as fake, FrozenHistory():
        for state in ("memory", "redis"):
            with (peer.redis_server() if state == "redis" else peer.no_redis()) as redis_url:
                system = peer.Peer(f"6{len(systems)}:PACEDPEER", fake.url, state, redis_url)
                systems.append(run(system, fake, offset, report, highest))
            highest = max(highest, systems[-1]["kept"])
            offset += 20 * peer.SPAN
        with closing(peer.agentloop_databases()) as databases:
            for label, url in databases:
                system = peer.Agentloop(f"6{len(systems)}:PACEDAGENTLOOP", fake.url, url, label)
                systems.append(run(system, fake, offset, report, highest))
                offset += 20 * peer.SPAN
    peers = [s for s in systems if not s["database"]]
    ours = {s["database"]: s for s in systems if s["database"]}
    report("peer-paced", "kept whole (every step up to it): "
                         + ", ".join(f"{s['name']} {s['kept']:.0f}/s" for s in systems))
    for system in ours.values():
        record(system, peers, ours)
    report("peer-paced", "reproduce with: .venv/bin/python -m tests.bench peer-paced")


def run(system, fake, offset, report, up_to):
    system.start()
    try:
        steps = climb(system, fake, offset, report, up_to)
    finally:
        system.stop()
    return {"name": system.name, "database": getattr(system, "database", ""), "window": system.window,
            "steps": steps, "kept": kept_rate(steps)}
