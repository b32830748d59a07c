"""Where a message's CPU goes under the peer workload (tests/bench/peer.py): the CPU time
each process of `make run` (the web server, the worker loop, the django-q2 cluster) and the
database server spent while `--messages` webhook POSTs were admitted, divided by the
messages; then the same until every reply is out (the whole message: its turn and its send
too). docs/scaling.md's "what saturates first" reads these figures.

    .venv/bin/python -m tests.bench.cpu                                  # SQLite (var/bench-cpu.sqlite3)
    DATABASE_URL=postgres://…/scratch .venv/bin/python -m tests.bench.cpu  # PostgreSQL (flushed!)

CPU time comes from /proc/<pid>/stat (user + system) of every process on the machine,
grouped by what it is, read before and after the POST phase; the load client's own
process ends inside the phase and is not counted. The replies are sent meanwhile, so
the worker's share includes turns and deliveries of the messages admitted so far.
"""

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.bench import peer
from tests.fakes.telegram_api import FakeBotAPI

BASE_DIR = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
GROUPS = ("web_server", "runloop", "qcluster", "postgres", "redis", "node")


def cpu_seconds_by_process() -> dict:
    """{pid: (what it is, CPU seconds so far)} for every process we may read."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                fields = stat.read().rsplit(")", 1)[1].split()
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        what = next((group for group in GROUPS if group in command), "other")
        found[pid] = (what, (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def spent_between(before, after) -> Counter:
    spent = Counter()
    for pid, (what, seconds) in after.items():
        spent[what] += seconds - before.get(pid, (what, 0.0))[1]
    return spent


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args(argv)
    database_url = os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'var' / 'bench-cpu.sqlite3'}"
    if database_url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(database_url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
    label = "PostgreSQL" if database_url.startswith("postgres") else "SQLite"
    # An empty database: the load client's update ids start at 0 again on every run.
    env = {**os.environ, "DATABASE_URL": database_url}
    for command in (["migrate", "--verbosity", "0"], ["flush", "--no-input"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=BASE_DIR, env=env, check=True, capture_output=True)
    with FakeBotAPI() as fake:
        system = peer.Agentloop("76:CPU", fake.url, database_url, label)
        system.start()
        try:
            # Warm (connections, caches, code paths): measure() posts WARMUP updates from
            # id 0, then WARMUP more; the measured POSTs start after both, all new chats.
            peer.measure(system, fake, peer.WARMUP, 0)
            before, started = cpu_seconds_by_process(), time.monotonic()
            posted = peer.post_updates(system, args.messages, 2 * peer.WARMUP)
            after, seconds = cpu_seconds_by_process(), time.monotonic() - started
            # Then until the last reply is out: the whole cost of a message, its turn and
            # its send included, whichever phase the worker did them in.
            answered = peer.wait_answered(fake, system.token, peer.chats(args.messages, 2 * peer.WARMUP),
                                          peer.ANSWER_TIMEOUT)
            done, whole = cpu_seconds_by_process(), time.monotonic() - started
        finally:
            system.stop()
    print(f"{label}: {args.messages} webhook POSTs in {seconds:.1f} s ({posted['rate']:.0f}/s, "
          f"p50 {posted['p50_ms']:.1f} ms, p99 {posted['p99_ms']:.1f} ms, {posted['errors']} errors), "
          f"{os.cpu_count()} cores")
    print_spent(spent_between(before, after), seconds, args.messages)
    unanswered = sum(1 for count in answered.values() if count == 0)
    print(f"until every reply was out ({whole:.1f} s from the first POST, {unanswered} unanswered; "
          f"'other' includes this script's fake Bot API):")
    print_spent(spent_between(before, done), whole, args.messages)
    print(f"reproduce with: {'DATABASE_URL=… ' if label != 'SQLite' else ''}.venv/bin/python -m tests.bench.cpu "
          f"--messages {args.messages}")


def print_spent(spent, seconds, messages):
    for what, cpu in spent.most_common():
        if cpu >= 0.01:
            print(f"  {what:10s} {cpu:6.2f} s CPU  {cpu / seconds * 100:4.0f}% of a core  "
                  f"{cpu / messages * 1000:5.2f} ms per message")
    total = sum(spent.values())
    print(f"  {'all':10s} {total:6.2f} s CPU  {total / seconds * 100:4.0f}% of a core  "
          f"{total / messages * 1000:5.2f} ms per message")


if __name__ == "__main__":
    os.chdir(BASE_DIR)
    main(sys.argv[1:])
