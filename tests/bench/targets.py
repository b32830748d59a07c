"""The targets a benchmark run met or missed, in one list at its end (issue 30: "make bench
prints every target met on both databases in one run").

Each benchmark records its targets as it reports them; `make bench` runs more than one
process (SQLite, then PostgreSQL for some benchmarks), so they are appended to one file and
read back once at the end:

    .venv/bin/python -m tests.bench.targets          # the summary of the last run
"""

import json
import os
import sys
from pathlib import Path

FILE = Path(__file__).resolve().parents[2] / "var" / "bench-logs" / "targets.jsonl"
# Set by scripts/bench.sh: its processes append to one list, and it prints the summary.
KEEP = "BENCH_TARGETS_KEEP"


def record(benchmark, database, target, ok, figure):
    """One target of one benchmark on one database: `target` as the issue says it ("accepted
    POSTs/s >= 1.3x the peer's best"), `figure` what this run measured ("1.42x")."""
    FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(FILE, "a") as out:
        out.write(json.dumps({"benchmark": benchmark, "database": database, "target": target,
                              "ok": bool(ok), "figure": figure}) + "\n")


def reset():
    FILE.unlink(missing_ok=True)


def recorded():
    if not FILE.exists():
        return []
    return [json.loads(line) for line in FILE.read_text().splitlines() if line.strip()]


def summary(rows):
    """The lines to print: every target with its figure, the missed ones marked, and a count."""
    if not rows:
        return ["no target recorded (the benchmarks run record theirs: peer, grown, sustained)"]
    lines = [f"  {'met    ' if row['ok'] else 'NOT MET'}  {row['benchmark']:<10} {row['database']:<11} "
             f"{row['target']}: {row['figure']}" for row in rows]
    missed = sum(not row["ok"] for row in rows)
    databases = sorted({row["database"] for row in rows})
    verdict = "every target met" if not missed else f"{missed} NOT MET"
    return [f"targets of this run ({', '.join(databases)}): {len(rows) - missed} of {len(rows)} met, {verdict}", *lines]


def print_summary(out=sys.stdout):
    print("\n" + "\n".join(summary(recorded())), file=out, flush=True)


def keeping():
    return bool(os.environ.get(KEEP))


if __name__ == "__main__":
    print_summary()
