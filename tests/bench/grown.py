"""Flat as the database grows (issue 30): the same measurements on an empty database and
on one pre-filled with a week of traffic (tests/bench/prefill.py: 1 million messages,
200,000 conversations, 1 million ledger rows, 500,000 claims, 2 million audit events),
in one run, each figure beside its empty-database reference:

- ingest: webhook POSTs/s through the real web server on each database, rounds interleaved
  (tests.bench.loadgen, 16 keep-alive clients), target >= 0.9x the empty one's;
- flush lateness p99 of 1,000 bursts with a worker running (the flush benchmark's own
  code, in a process set on each database), target <= 1.2x;
- the story page of the 5,000-message conversation (<= 300 ms), every admin changelist
  with its common filters and search (<= 300 ms), and the dashboard's snapshot over its
  websocket (<= 200 ms): real HTTP, a logged-in staff session, median of interleaved
  requests after one warm-up each.

    .venv/bin/python -m tests.bench grown        (SQLite; DATABASE_URL=postgres://… for PostgreSQL)

The pre-filled database is built once per migrations' state and kept (var/bench-cache/);
the run works on a copy. The machine is shared: medians, and every figure's reference
measured in the same run.
"""

import json
import statistics
import subprocess
import sys
from datetime import UTC, datetime

import httpx

from tests.bench import grown_pages, prefill, targets
from tests.bench.grown_db import Databases

FLUSH_ROUNDS = 5  # the first of each database runs on a cold cache; a p99 of 1,000 flushes moves by tenths of a ms from run to run
INGEST_ROUNDS = 5
INGEST_N = 3000
PAGE_ROUNDS = 5


def bench_grown(kit):
    """`kit`: the runner (tests.bench.__main__)."""
    databases = Databases(kit)
    empty, grown = databases.prepare()
    print(f"[grown] databases ready: {databases.note}", flush=True)
    servers = {}
    try:
        for name, url in (("empty", empty), ("grown", grown)):
            servers[name] = web_server(kit, name, url)
        flush = {name: [] for name in servers}
        for round_ in range(FLUSH_ROUNDS):
            for name, url in (("empty", empty), ("grown", grown)):
                flush[name].append(flush_run(kit, url, f"gf{round_}x"))
        ingest = ingest_rounds(kit, servers)
        pages = grown_pages.measure({name: base for name, (_, base) in servers.items()}, PAGE_ROUNDS)
    finally:
        for proc, _ in servers.values():
            kit.stop(proc)
    report(kit, flush, ingest, pages, databases)
    plans = subprocess.run([sys.executable, "-m", "tests.bench.grown_plans"], cwd=kit.BASE_DIR, capture_output=True,
                           text=True, env={**kit.os.environ, "DATABASE_URL": grown})
    print(f"[grown] the plans behind these figures, on the grown database:\n{plans.stdout}{plans.stderr[-2000:]}")


def bench_grown_pages(kit):
    """The pages alone (`python -m tests.bench grown-pages`): the same databases, servers
    and probes as bench_grown, without its ingest and flush rounds (a few minutes less),
    each database's webhook warmed by 500 messages first as there."""
    databases = Databases(kit)
    empty, grown = databases.prepare()
    servers = {}
    try:
        for name, url in (("empty", empty), ("grown", grown)):
            servers[name] = web_server(kit, name, url)
        secret = [f"X-Telegram-Bot-Api-Secret-Token: {prefill.SECRET}"]
        for _, base in servers.values():
            kit.loadgen(f"{base}/webhooks/telegram/bench-tg/", 500, 0, headers=secret)
        pages = grown_pages.measure({name: base for name, (_, base) in servers.items()}, PAGE_ROUNDS)
    finally:
        for proc, _ in servers.values():
            kit.stop(proc)
    report_pages(kit, pages, databases)


def web_server(kit, name, database_url):
    port = kit.free_port()
    proc = kit.start(f"grown-web-{name}", [sys.executable, "-m", "agentloop.web_server", "--port", str(port)], DATABASE_URL=database_url)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    kit.wait_until(up, 60, f"the web server on the {name} database")
    return proc, base


def flush_run(kit, database_url, tag):
    """The flush benchmark's bursts in a process of its own set on that database."""
    out = subprocess.run([sys.executable, "-m", "tests.bench.grown_flush", tag], cwd=kit.BASE_DIR,
                         env={**kit.os.environ, "DATABASE_URL": database_url}, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the flush run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ingest_rounds(kit, servers):
    hooks = {name: f"{base}/webhooks/telegram/bench-tg/" for name, (_, base) in servers.items()}
    secret = [f"X-Telegram-Bot-Api-Secret-Token: {prefill.SECRET}"]
    for hook in hooks.values():
        kit.loadgen(hook, 500, 0, headers=secret)
    rates, offset = {name: [] for name in hooks}, 1000
    for _ in range(INGEST_ROUNDS):
        for name, hook in hooks.items():
            result = kit.loadgen(hook, INGEST_N, offset, headers=secret)
            if result["errors"]:
                raise SystemExit(f"ingest on the {name} database: {result['errors']} errors ({result['statuses']})")
            rates[name].append(result["rate"])
        offset += INGEST_N
    return rates


def met(ok):
    return "met" if ok else "NOT MET"


def report(kit, flush, ingest, pages, databases):
    e, g = statistics.median(ingest["empty"]), statistics.median(ingest["grown"])
    kit.report("grown-ingest", f"{g:.0f} msg/s through the webhook on the grown database vs {e:.0f} on the empty "
                               f"one: ratio {g / e:.2f} (target >= 0.9: {met(g / e >= 0.9)}); median of "
                               f"{INGEST_ROUNDS} interleaved rounds x {INGEST_N} requests, 16 clients")
    e99 = statistics.median(r["p99"] for r in flush["empty"])
    g99 = statistics.median(r["p99"] for r in flush["grown"])
    lost = sum(r["lost"] + r["double"] for runs in flush.values() for r in runs)
    kit.report("grown-flush", f"flush lateness p99 {g99:.1f} ms on the grown database vs {e99:.1f} ms on the empty "
                              f"one: ratio {g99 / e99:.2f} (target <= 1.2: {met(g99 <= 1.2 * e99)}); median of "
                              f"{FLUSH_ROUNDS} runs x 1,000 bursts each (p99s: grown "
                              f"{[round(r['p99'], 1) for r in flush['grown']]}, empty "
                              f"{[round(r['p99'], 1) for r in flush['empty']]}); lost or double-flushed: {lost}")
    report_pages(kit, pages, databases)
    db = database_label(kit)
    targets.record("grown", db, "ingest on the grown database >= 0.9x the empty one's", g / e >= 0.9,
                   f"{g / e:.2f}x ({g:.0f} vs {e:.0f} msg/s)")
    targets.record("grown", db, "flush lateness p99 on the grown database <= 1.2x the empty one's",
                   g99 <= 1.2 * e99 and not lost, f"{g99 / e99:.2f}x ({g99:.1f} vs {e99:.1f} ms), {lost} lost or doubled")


def database_label(kit):
    return "PostgreSQL" if kit.os.environ["DATABASE_URL"].startswith("postgres") else "SQLite"


def report_pages(kit, pages, databases):
    for page in pages:
        kit.report("grown-page", f"{page.label}: {page.grown_ms:.0f} ms on the grown database vs {page.empty_ms:.0f} "
                                 f"ms on the empty one (target <= {page.target} ms: "
                                 f"{met(page.grown_ms <= page.target)}); {page.note}")
    slow = [p.label for p in pages if p.grown_ms > p.target]
    worst = max(pages, key=lambda p: p.grown_ms / p.target)
    targets.record("grown", database_label(kit), "every page within its target on the grown database "
                   "(story page, admin changelists <= 300 ms, dashboard snapshot <= 200 ms)", not slow,
                   f"{len(pages) - len(slow)} of {len(pages)}" + (f", over: {', '.join(slow)}" if slow else "")
                   + f"; closest: {worst.label} {worst.grown_ms:.0f} ms of {worst.target}")
    kit.report("grown", f"{len(pages) - len(slow)} of {len(pages)} pages within their targets"
                        + (f"; over: {', '.join(slow)}" if slow else "") + f"; {databases.note}; "
                        f"measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
