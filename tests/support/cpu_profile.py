"""Where the suite's CPU goes, per test: `AGENTLOOP_CPU_PROFILE=<folder> make test`.

`make test` keeps both cores busy from start to end (issue 52), so its length is its
CPU, and a test's wall time says little of what it costs the others. With the variable
set, each pytest process appends a line per test to `<folder>/<pid>.jsonl`: the CPU
seconds the pytest process itself used (the test's code and its fake platforms' threads),
its product processes forked by the zygote that ended meanwhile (tests/support/zygote.py
reports each child's rusage), its other children reaped meanwhile (a throwaway
PostgreSQL, Chromium's driver, Synapse), and the wall time. A process that outlives its
test is counted in the test that stopped it. Not counted: the suite's PostgreSQL server,
the static checks, a browser kept for a whole session until that session's end.

    python -m tests.support.cpu_profile <folder> [N]

prints the totals by kind and the N files that cost most (both passes, and each).
"""

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

FOLDER = os.environ.get("AGENTLOOP_CPU_PROFILE")
KINDS = ("self", "forked", "children")


def _now():
    from tests.support.zygote import Zygote

    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.process_time(), Zygote.ended_children_cpu, reaped.ru_utime + reaped.ru_stime, time.monotonic())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not FOLDER:
        yield
        return
    before = _now()
    yield
    spent = [round(after - earlier, 3) for after, earlier in zip(_now(), before, strict=True)]
    line = {"test": item.nodeid, "pass": os.environ.get("AGENTLOOP_TEST_PASS", ""),
            **dict(zip((*KINDS, "wall"), spent, strict=True))}
    with open(Path(FOLDER) / f"{os.getpid()}.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")


def report(folder, top=30):
    tests = [json.loads(line) for path in Path(folder).glob("*.jsonl") for line in path.read_text().splitlines()]
    by_kind, by_file = collections.Counter(), collections.defaultdict(collections.Counter)
    for test in tests:
        file = test["test"].split("::")[0]
        for kind in KINDS:
            by_kind[kind] += test[kind]
            by_file[file][test["pass"]] += test[kind]
            by_file[file]["all"] += test[kind]
        by_file[file]["wall"] += test["wall"]
    print(f"{len(tests)} tests, {sum(by_kind.values()):.0f} CPU-s: " +
          ", ".join(f"{kind} {by_kind[kind]:.0f}" for kind in KINDS))
    print(f"{'CPU-s':>7} {'SQLite':>7} {'PgSQL':>7} {'wall-s':>7}  file")
    for file, spent in sorted(by_file.items(), key=lambda item: -item[1]["all"])[:top]:
        print(f"{spent['all']:7.1f} {spent['sqlite']:7.1f} {spent['postgres']:7.1f} {spent['wall']:7.1f}  {file}")


if __name__ == "__main__":
    report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
