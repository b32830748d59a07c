"""The peer benchmark's run (tests/bench/peer.py has its systems and measurements): each
system in turn, the load client's own ceiling, the comparison with the peer's best
configuration, the steady state side by side, and issue 30's targets recorded for the
summary at the end of `make bench` (tests/bench/targets.py)."""

import os
import shutil
from contextlib import closing

from tests.bench import targets
from tests.bench.peer import (
    CONCURRENCY,
    KILL_BURST,
    MESSAGES,
    SPAN,
    SPIKE_ANSWER_WITHIN,
    SPIKE_LATER,
    SUSTAINED,
    WARMUP,
    Agentloop,
    Peer,
    System,
    agentloop_databases,
    ensure_node_modules,
    load,
    no_redis,
    post_for,
    redis_server,
    run_system,
)


class BareNode(System):
    """The load client's own ceiling: a Node HTTP server that reads each POST whole and
    answers 200 at once, nothing else (issue 30's table has its row)."""

    hook_path = "/webhooks/telegram"
    name = "bare Node HTTP (the load client's ceiling)"
    SERVER = ("require('http').createServer((q, s) => { q.resume(); q.on('end', () => s.end('ok')); })"
              ".listen(Number(process.argv[1]), '127.0.0.1');")

    def __init__(self):
        super().__init__("", "peer-bare-node")

    def command(self, port):
        return ["node", "-e", self.SERVER, str(port)]


def client_ceiling(seconds):
    """The load client against BareNode for `seconds` (the steady state's length): its
    accepted POSTs/s and POST p50/p99, so every system's figure can be read against it."""
    system = BareNode().start()
    try:
        load(system, 0, "--n", str(WARMUP))
        run = post_for(system, seconds, WARMUP)
    finally:
        system.stop()
    return {"rate": run["rate"], "p50": run["p50_ms"], "p99": run["p99_ms"], "errors": run["errors"]}


def steady_line(f):
    t = f["steady"]
    return (f"steady state, {t['seconds']:.1f} s of load: {t['rate']:.0f} accepted webhook POSTs/s, POST p50 "
            f"{t['p50']:.1f} ms, p99 {t['p99']:.1f} ms, {t['errors']} errors; replies delivered within the window "
            f"{t['replies_rate']:.0f}/s ({t['owed_at_end']} still owed when it ended, all out {t['drained']:.1f} s "
            f"later); answered exactly once {t['once']}/{t['once'] + t['missing'] + t['doubled']} "
            f"({t['missing']} missing, {t['doubled']} doubled)")


def line(f):
    k = f["kill"]
    return (f"{f['rate']:.0f} accepted webhook POSTs/s, POST p50 {f['p50']:.1f} ms, p99 {f['p99']:.1f} ms, "
            f"{f['errors']} errors; answered exactly once {f['once']}/{f['once'] + f['missing'] + f['doubled']} "
            f"({f['missing']} missing, {f['doubled']} doubled); SIGKILL mid-burst: {k['answered']}/{KILL_BURST} "
            f"answered after restart ({k['accepted']} accepted, {k['before_kill']} answered before the kill, "
            f"{k['doubled']} doubled)")


# --- the benchmark -----------------------------------------------------------------------

def record_targets(ours, best):
    """Issue 30's steady-state targets, for the summary at the end of the run (tests.bench.targets)."""
    t, b, db = ours["steady"], best["steady"], ours["database"]
    targets.record("peer", db, "steady accepted POSTs/s >= 1.3x the peer's best", t["rate"] / b["rate"] >= 1.3,
                   f"{t['rate'] / b['rate']:.2f}x ({t['rate']:.0f} vs {b['rate']:.0f}/s, {best['name']}; replies "
                   f"within the window {t['replies_rate'] / b['replies_rate']:.2f}x)")
    targets.record("peer", db, "steady POST p99 <= 1.0x the peer's best", t["p99"] <= b["p99"],
                   f"{t['p99'] / b['p99']:.2f}x ({t['p99']:.1f} vs {b['p99']:.1f} ms)")
    wrong = sum(run["errors"] + run["missing"] + run["doubled"] for run in (ours, t))
    targets.record("peer", db, "every message answered exactly once", wrong == 0,
                   f"{wrong} errors, missing or doubled (burst and steady state)")
    kill = ours["kill"]
    targets.record("peer", db, f"{KILL_BURST}/{KILL_BURST} answered once after a SIGKILL mid-burst",
                   kill["answered"] == KILL_BURST and not kill["doubled"],
                   f"{kill['answered']}/{KILL_BURST} answered, {kill['doubled']} doubled")


def ms(seconds):
    return "—" if seconds is None else f"{seconds * 1000:,.0f}"


def spike_line(f):
    w = f["steady"]["waits"]
    return (f"  {f['name']:<38} {w['accepted']:6d} accepted  {w['at_end']:4.0%} answered when the load stopped, "
            f"{w['later']:4.0%} {SPIKE_LATER:g} s later  message → reply p50 {ms(w['p50'])} / p99 {ms(w['p99'])} / "
            f"max {ms(w['max'])} ms  {w['within']:.1%} within {SPIKE_ANSWER_WITHIN:g} s  (its window {f['window']:g} s: "
            f"beyond it p50 {ms(beyond(w['p50'], f))} / p99 {ms(beyond(w['p99'], f))} ms)")


def beyond(wait, f):
    return None if wait is None else wait - f["window"]


def record_spike_targets(ours, peers):
    """Issue 57's spike targets: replies when the load stopped at least the peer's share (its
    best configuration's, by that share), every accepted message answered within 5 s."""
    w, db = ours["steady"]["waits"], ours["database"]
    best = max(peers, key=lambda f: f["steady"]["waits"]["at_end"])
    b = best["steady"]["waits"]
    targets.record("spike", db, "answered when the load stopped >= the peer's share", w["at_end"] >= b["at_end"],
                   f"{w['at_end']:.0%} vs {b['at_end']:.0%} ({best['name']})")
    targets.record("spike", db, f"every accepted message answered within {SPIKE_ANSWER_WITHIN:g} s",
                   w["within"] >= 1.0, f"{w['within']:.1%} (max {w['max'] or 0:.1f} s, p99 {w['p99'] or 0:.2f} s, "
                                       f"{ours['window']:g} s of it the window)")


def bench_peer(report=print):
    from tests.fakes.telegram_api import FakeBotAPI

    if not shutil.which("node"):
        report("peer", "skipped: `node` is missing (install Node.js 20+ to compare with the Chat SDK peer)")
        return
    ensure_node_modules()
    messages = int(os.environ.get("BENCH_PEER_MESSAGES") or MESSAGES)
    seconds = float(os.environ.get("BENCH_PEER_SECONDS") or SUSTAINED)
    results, offset = [], 0
    with FakeBotAPI() as fake, closing(agentloop_databases()) as databases:
        for label, url in databases:
            results.append(run_system(Agentloop(f"7{len(results)}:AGENTLOOP", fake.url, url, label),
                                      fake, messages, seconds, offset))
            report("peer", f"{results[-1]['name']}: {line(results[-1])}")
            report("peer", f"{results[-1]['name']}: {steady_line(results[-1])}")
            offset += SPAN
        peers = []
        for state in ("memory", "redis"):
            with (redis_server() if state == "redis" else no_redis()) as redis_url:
                peers.append(run_system(Peer(f"8{len(peers)}:PEER", fake.url, state, redis_url), fake,
                                        messages, seconds, offset))
            report("peer", f"{peers[-1]['name']}: {line(peers[-1])}")
            report("peer", f"{peers[-1]['name']}: {steady_line(peers[-1])}")
            offset += SPAN
    ceiling = client_ceiling(seconds)
    report("peer", f"{BareNode.name}, {seconds:g} s: {ceiling['rate']:.0f} POSTs/s, POST p50 {ceiling['p50']:.1f} ms, "
                   f"p99 {ceiling['p99']:.1f} ms, {ceiling['errors']} errors")
    best = max(peers, key=lambda f: f["rate"])
    steady_best = max(peers, key=lambda f: f["steady"]["rate"])
    for ours in results:
        report("peer", f"{ours['name']} / {best['name']} (the peer's best), the {messages}-message burst: POSTs/s "
                       f"{ours['rate'] / best['rate']:.2f}x, POST p99 {ours['p99'] / best['p99']:.2f}x, "
                       f"{ours['errors']} errors, {ours['missing'] + ours['doubled']} not answered exactly once")
        t, b = ours["steady"], steady_best["steady"]
        report("peer", f"{ours['name']} / {steady_best['name']} (the peer's best), steady state: POSTs/s "
                       f"{t['rate'] / b['rate']:.2f}x (target >= 1.3), POST p99 {t['p99'] / b['p99']:.2f}x "
                       f"(target <= 1.0), replies delivered within the window {t['replies_rate'] / b['replies_rate']:.2f}x, "
                       f"{t['errors']} errors, {t['missing'] + t['doubled']} not answered exactly once (target 0 and 0), "
                       f"SIGKILL mid-burst {ours['kill']['answered']}/{KILL_BURST} answered (target {KILL_BURST})")
        record_targets(ours, steady_best)
    report("peer", f"side by side, the steady state ({seconds:g} s of load each, this run): accepted POSTs/s, "
                   f"POST p50 / p99, replies delivered within the window per second")
    for system in [*results, *peers]:
        t = system["steady"]
        report("peer", f"  {system['name']:<38} {t['rate']:6.0f}/s  {t['p50']:5.1f} / {t['p99']:5.1f} ms  "
                       f"{t['replies_rate']:5.0f} replies/s")
    report("peer", f"  {BareNode.name:<38} {ceiling['rate']:6.0f}/s  {ceiling['p50']:5.1f} / {ceiling['p99']:5.1f} ms")
    report("peer", f"the {seconds:g} s spike (the steady state above), what a person waits: from their POST's 200 "
                   f"to their reply's sendMessage at the Bot API (issue 57)")
    for system in [*results, *peers]:
        report("peer", spike_line(system))
    for ours in results:
        record_spike_targets(ours, peers)
    report("peer", f"per system: {messages} messages as a burst after {WARMUP} warm-up, then {seconds:g} s of steady "
                   f"load; {CONCURRENCY} keep-alive clients, a new chat each; reproduce with: "
                   f".venv/bin/python -m tests.bench peer")
