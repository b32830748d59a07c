"""Back-to-back windows of the spike load on one `runall` (issue 57): the peer
benchmark's workload (16 keep-alive clients, a new chat per POST, the echo agent, an
unlimited local Bot API, pacing off) in windows of WINDOW seconds, one after the other,
for SPAN seconds, on a fresh database of each kind.

Per window: accepted POSTs/s and that figure over the first window's, POST p99 and its
ratio to the first's, the messages sent so far and the replies the Bot API had received
when the window ended (the share answered while the load went on). Issue 57's target:
every window >= 0.85x the first's rate, POST p99 <= 1.5x the first's, on both databases.

    .venv/bin/python -m tests.bench spike                 # 3 minutes per database
    .venv/bin/python -m tests.bench spike --seconds 60    # a quick look
"""

from contextlib import closing

from tests.bench import targets
from tests.bench.peer import CONCURRENCY, Agentloop, agentloop_databases, post_for

WINDOW = 20.0  # seconds of load per window
SPAN = 180.0  # seconds of windows per database (issue 57: 3 minutes)
KEPT = 0.85  # each window's rate over the first's, at least
P99_GROWTH = 1.5  # each window's POST p99 over the first's, at most


def windows(system, fake, span, report):
    """Run the windows against a started `system`; one row per window."""
    rows, offset, sent = [], 0, 0
    for number in range(1, max(1, round(span / WINDOW)) + 1):
        run = post_for(system, WINDOW, offset)
        # loadgen numbers connection c's k-th message offset + c + k * CONCURRENCY: the
        # next window starts past every number this one may have used.
        offset += (max(run["per_client"]) + 1) * CONCURRENCY
        sent += run["n"]
        answered = len(fake.calls("sendMessage", token=system.token))
        first = rows[0] if rows else None
        row = {"window": number, "rate": run["rate"], "p99": run["p99_ms"], "errors": run["errors"], "sent": sent,
               "answered": answered, "of_first": run["rate"] / first["rate"] if first else 1.0,
               "p99_of_first": run["p99_ms"] / first["p99"] if first else 1.0}
        rows.append(row)
        report("spike", f"{system.database} window {number} ({WINDOW:g} s): {row['rate']:.0f} POSTs/s "
                        f"({row['of_first']:.2f}x the first), POST p99 {row['p99']:.1f} ms "
                        f"({row['p99_of_first']:.2f}x), {row['errors']} errors; {sent} sent so far, "
                        f"{answered} answered at the window's end ({answered / sent:.0%})")
    return rows


def judge(rows, database, report):
    weakest = min(rows, key=lambda r: r["of_first"])
    slowest = max(rows, key=lambda r: r["p99_of_first"])
    kept = weakest["of_first"] >= KEPT
    held = slowest["p99_of_first"] <= P99_GROWTH
    report("spike", f"{database}: the weakest window kept {weakest['of_first']:.2f}x the first's rate "
                    f"(window {weakest['window']}; target >= {KEPT}: {'met' if kept else 'NOT MET'}), the slowest "
                    f"POST p99 {slowest['p99_of_first']:.2f}x the first's (window {slowest['window']}; target "
                    f"<= {P99_GROWTH}: {'met' if held else 'NOT MET'})")
    targets.record("spike", database, f"every {WINDOW:g} s window >= {KEPT}x the first's POSTs/s", kept,
                   f"{weakest['of_first']:.2f}x")
    targets.record("spike", database, f"every window's POST p99 <= {P99_GROWTH}x the first's", held,
                   f"{slowest['p99_of_first']:.2f}x")


def bench_spike(report, span=None):
    from tests.fakes.telegram_api import FakeBotAPI

    span = span or SPAN
    with FakeBotAPI() as fake, closing(agentloop_databases()) as databases:
        for number, (label, url) in enumerate(databases):
            system = Agentloop(f"57{number}:SPIKE", fake.url, url, label).start()  # a token each: its own replies
            try:
                rows = windows(system, fake, span, report)
            finally:
                system.stop()
            judge(rows, label, report)
