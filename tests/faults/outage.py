"""The database goes away and comes back: figures for the closing note, and the
scenarios tests/end_to_end/test_faults_database.py asserts on.

    .venv/bin/python -m tests.faults.outage [--scenario NAME ...]

PostgreSQL runs on a throwaway cluster of its own (scripts/pg.sh, in a folder under
/tmp the `postgres` user owns) — it is stopped and started again, so never the
suite's server. The product runs as real processes (daphne, `manage.py runloop`);
messages come in through the real Telegram webhook and replies go to the local fake
Bot API. Each webhook delivery is retried until it gets a 2xx, as Telegram does.

Scenarios (each prints its figures as JSON on one line):
  restart       60 chats ask one question each over 30 s; the database is stopped at
                10 s and started again 3 s later. Missing replies, unlabelled duplicate
                replies, seconds from the database's return to the first flush, worker
                log lines per second during the outage, and how long a message sent
                after the outage waited beyond its window.
  slow-turn     a turn running (a 6 s agent) while the database is away 8 s: its reply
                arrives once, and the next message in that chat is answered.
  terminate     traffic in flight while every backend is killed (pg_terminate_backend).
  sqlite-lock   SQLite: a writer holds the lock (BEGIN IMMEDIATE) longer than
                SQLITE_TIMEOUT; then lets go.
"""

import argparse
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC
from pathlib import Path

import httpx

from tests.support import local_http

BASE_DIR = Path(__file__).resolve().parents[2]
PG = str(BASE_DIR / "scripts" / "pg.sh")
RESULTS = "outage-results: "
SCENARIOS = ("restart", "slow-turn", "terminate", "sqlite-lock")
POSTGRES_SCENARIOS = ("restart", "slow-turn", "terminate")
TOKEN_BASE = 7700
LOGS = "AGENTLOOP_OUTAGE_LOGS"  # the folder a scenario's process logs go under


# --- the throwaway cluster ---------------------------------------------------------


class Cluster:
    """A PostgreSQL cluster of our own, to stop and start at will."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="agentloop-outage-pg-", dir="/tmp")
        started = subprocess.run([PG, "start", self.dir], capture_output=True, text=True)
        if started.returncode != 0:
            raise RuntimeError(f"could not start PostgreSQL in {self.dir}: {started.stderr}")
        self.url = started.stdout.strip().splitlines()[-1]

    def down(self):
        """`pg_ctl stop -m fast`: every connection is cut, new ones are refused."""
        subprocess.run([PG, "down", self.dir], check=True, capture_output=True)

    def up(self):
        subprocess.run([PG, "up", self.dir], check=True, capture_output=True)

    def terminate_backends(self):
        """pg_terminate_backend of every other connection to the product's database."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]

    def stop(self):
        subprocess.run([PG, "stop", self.dir], capture_output=True)


def postgres_available():
    return any(Path(d, "pg_ctl").exists() for d in Path("/usr/lib/postgresql").glob("*/bin")) or bool(
        subprocess.run(["sh", "-c", "command -v pg_ctl"], capture_output=True).stdout)


# --- running scenarios in a child process (Django set up on the scenario's database) ---


def run_scenarios(url, names, timeout=300, **params):
    """Run scenarios in a child process on the database at `url`; their figures.
    `params`: per scenario name, keyword arguments for it (smaller runs in tests)."""
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO",
           "AGENTLOOP_OUTAGE_PARAMS": json.dumps({k.replace("_", "-"): v for k, v in params.items()})}
    from tests.conftest import run_python  # forked from the zygote when a test runs this

    child = run_python([sys.executable, "-m", "tests.faults.outage", "_child", *names], env=env, timeout=timeout)
    figures = {}
    for line in child.stdout.splitlines():
        if line.startswith(RESULTS):
            figures.update(json.loads(line[len(RESULTS):]))
    if child.returncode != 0 or set(figures) != set(names):
        raise RuntimeError(f"scenarios {names} failed (exit {child.returncode}):\n{child.stdout[-4000:]}\n"
                           f"{child.stderr[-8000:]}")
    return figures


@contextlib.contextmanager
def sqlite_url():
    with tempfile.TemporaryDirectory(prefix="agentloop-outage-") as folder:
        yield f"sqlite:///{folder}/outage.sqlite3"


def child(names):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)  # a cluster serves several runs
    cluster = None
    if os.environ.get("AGENTLOOP_OUTAGE_PGDIR"):
        cluster = Cluster.__new__(Cluster)
        cluster.dir, cluster.url = os.environ["AGENTLOOP_OUTAGE_PGDIR"], os.environ["DATABASE_URL"]
    params = json.loads(os.environ.get("AGENTLOOP_OUTAGE_PARAMS") or "{}")
    from tests.conftest import stop_zygote

    try:
        for index, name in enumerate(names):
            figures = Scenario(name, index, cluster).run(**params.get(name, {}))
            print(RESULTS + json.dumps({name: figures}), flush=True)
    finally:
        stop_zygote()
    return 0


# --- the scenarios ----------------------------------------------------------------


class Scenario:
    def __init__(self, name, index, cluster):
        from tests.conftest import Processes

        self.name, self.cluster = name, cluster
        # Under the test's own tmp_path when a test runs it (pytest keeps the last few runs'),
        # under /tmp when run by hand.
        self.logs = Path(tempfile.mkdtemp(prefix=f"agentloop-outage-{name}-", dir=os.environ.get(LOGS)))
        self.processes = Processes(self.logs, metrics_dir=self.logs / "metrics")
        self.token = f"{TOKEN_BASE + index}:OUTAGE-{index}"
        self.slug = f"outage-{index}"
        self.chat_base = 100_000 * (index + 1)

    def run(self, **params):
        from tests.fakes.telegram_api import FakeBotAPI

        with FakeBotAPI() as fake:
            self.fake = fake
            try:
                figures = getattr(self, self.name.replace("-", "_"))(**params)
            finally:
                self.processes.stop_all()
        figures["logs"] = str(self.logs)
        return figures

    # --- plumbing ---

    def channel(self, **fields):
        from conversations.models import Channel
        from tests.support.e2e import SECRET

        return Channel.objects.create(slug=self.slug, kind="telegram", platform_settings={
            "bot_token": self.token, "webhook_secret": SECRET, "api_base": self.fake.url}, **fields)

    def start(self, **env):
        self.web = self.processes.web(**env)
        self.worker = self.processes.worker(**env)

    def deliver(self, chat_id, text):
        """POST one update to the webhook until it is taken (2xx), as Telegram retries;
        returns when it was taken (wall clock)."""
        from tests.support.e2e import SECRET, update

        body = update(chat_id, text)
        pause = 0.1
        while True:
            try:
                response = local_http.post(f"{self.web.url}/webhooks/telegram/{self.slug}/", json=body,
                                      headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
                if response.status_code < 300:
                    return time.time()
            except httpx.HTTPError:
                pass
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def spread(self, asked, start, over):
        """Deliver each question in its own thread, evenly over `over` seconds from
        `start` (monotonic); returns the threads."""
        senders = []
        for i, (chat_id, question) in enumerate(asked.items()):
            time.sleep(max(0.0, start + i * over / len(asked) - time.monotonic()))
            sender = threading.Thread(target=self.deliver, args=(chat_id, question))
            sender.start()
            senders.append(sender)
        return senders

    def replies(self, chat_id):
        return [(c.params["text"], c.wall) for c in self.fake.calls("sendMessage", self.token)
                if int(c.params["chat_id"]) == chat_id]

    def counted(self, asked):
        """Over {chat: question}: missing, unlabelled duplicates, labelled resends."""
        from delivery.ledger import RECOVERY_PREFIX

        missing = duplicates = labelled = 0
        for chat_id, question in asked.items():
            texts = [text for text, _ in self.replies(chat_id)]
            plain = sum(text == question for text in texts)
            labelled += sum(text.startswith(RECOVERY_PREFIX) for text in texts)
            missing += plain == 0 and not any(question in text for text in texts)
            duplicates += max(0, plain - 1)
        return {"missing": missing, "unlabelled_duplicates": duplicates, "labelled_resends": labelled}

    def wait_answered(self, asked, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(any(q in text for text, _ in self.replies(chat)) for chat, q in asked.items()):
                return True
            time.sleep(0.1)
        return False

    def quiet(self, seconds=1.5):
        """Give late duplicates their chance to show up."""
        time.sleep(seconds)

    def log_offset(self):
        return self.worker.log_path.stat().st_size

    def log_text(self, start, end, limit=40):
        """The lines themselves (the first `limit`), shown when a quiet-log check fails."""
        with open(self.worker.log_path, "rb") as f:
            f.seek(start)
            return f.read(end - start).decode(errors="replace").splitlines()[:limit]

    def log_lines(self, start, end):
        with open(self.worker.log_path, "rb") as f:
            f.seek(start)
            return f.read(end - start).count(b"\n")

    def after_outage(self, back_at, chat_id, text="Are you still there after the outage?"):
        """A message sent once the database is back: seconds beyond its window it waited."""
        from django.db import connection

        from conversations.models import MessageBuffer

        sent = self.deliver(chat_id, text)
        if not self.wait_answered({chat_id: text}, 30):
            return {"after_outage_answered": False}
        answered = max(wall for t, wall in self.replies(chat_id) if text in t)
        connection.close()
        buffer = MessageBuffer.objects.filter(conversation__chat_id=str(chat_id)).order_by("-pk").first()
        window = (buffer.flush_at - buffer.last_message_at).total_seconds()
        return {"after_outage_answered": True, "after_outage_window": round(window, 2),
                "after_outage_beyond_window": round(answered - max(sent, back_at) - window, 2)}

    def first_flush_after(self, back_at):
        """Seconds from the database's return to the first buffer flushed after it."""
        from datetime import datetime

        from django.db import connection
        from django.db.models import Min

        from conversations.models import MessageBuffer

        connection.close()
        since = datetime.fromtimestamp(back_at, UTC)
        at = MessageBuffer.objects.filter(flushed_at__gte=since, conversation__channel__slug=self.slug).aggregate(
            at=Min("flushed_at"))["at"]
        return None if at is None else round(at.timestamp() - back_at, 2)

    # --- scenarios ---

    def restart(self, chats=60, over=30.0, down_at=10.0, down_for=3.0):
        self.channel()
        self.start()
        asked = {self.chat_base + i: f"Question {i}: when is my appointment?" for i in range(chats)}
        start = time.monotonic()
        outage = {}

        def database():
            time.sleep(down_at)
            outage["offset"] = self.log_offset()
            outage["down"] = time.time()
            self.cluster.down()  # down_for=0: `pg_ctl restart -m fast`
            time.sleep(down_for)
            self.cluster.up()
            outage["up"] = time.time()
            outage["end_offset"] = self.log_offset()

        restarter = threading.Thread(target=database)
        restarter.start()
        senders = self.spread(asked, start, over)
        restarter.join()
        for sender in senders:
            sender.join()
        answered = self.wait_answered(asked, 45)
        figures = self.after_outage(outage["up"], self.chat_base + chats)
        self.quiet()
        outage_seconds = outage["up"] - outage["down"]
        figures.update(self.counted(asked))
        figures.update({
            "all_answered": answered,
            "database_down_seconds": round(outage_seconds, 2),
            "first_flush_after_return": self.first_flush_after(outage["up"]),
            "worker_log_lines_during_outage": self.log_lines(outage["offset"], outage["end_offset"]),
            "worker_log_during_outage": self.log_text(outage["offset"], outage["end_offset"]),
            "worker_log_lines_per_second": round(
                self.log_lines(outage["offset"], outage["end_offset"]) / outage_seconds, 1),
        })
        return figures

    def slow_turn(self, agent_delay=6.0, down_for=8.0):
        from django.db import connection

        from conversations.models import Turn, TurnState

        self.channel(agent_config={"delay": agent_delay})
        self.start()
        chat_id, question = self.chat_base, "Please look this up for me (slowly)."
        self.deliver(chat_id, question)
        deadline = time.monotonic() + 20
        while not Turn.objects.filter(state=TurnState.RUNNING, conversation__chat_id=str(chat_id)).exists():
            assert time.monotonic() < deadline, "the turn never started"
            time.sleep(0.05)
        connection.close()
        offset = self.log_offset()
        down = time.time()
        self.cluster.down()
        time.sleep(down_for)
        self.cluster.up()
        up = time.time()
        end_offset = self.log_offset()
        answered = self.wait_answered({chat_id: question}, 20)
        follow_up = "And one more thing?"
        self.deliver(chat_id, follow_up)
        followed = self.wait_answered({chat_id: follow_up}, 20)
        self.quiet()
        texts = [text for text, _ in self.replies(chat_id)]
        return {"answered": answered, "reply_count": sum(question in t for t in texts),
                "next_message_answered": followed, "follow_up_count": sum(follow_up in t for t in texts),
                "database_down_seconds": round(up - down, 2),
                "worker_log_lines_per_second": round(self.log_lines(offset, end_offset) / (up - down), 1),
                **self.counted({chat_id: question})}

    def terminate(self, chats=20, over=6.0, kill_at=2.0, kills=3):
        self.channel()
        self.start()
        asked = {self.chat_base + i: f"Question {i}: is the clinic open?" for i in range(chats)}
        start, killed = time.monotonic(), []

        def killer():
            time.sleep(kill_at)
            for _ in range(kills):  # again while the product reconnects
                killed.append(self.cluster.terminate_backends())
                time.sleep(0.7)

        thread = threading.Thread(target=killer)
        thread.start()
        offset = self.log_offset()
        senders = self.spread(asked, start, over)
        thread.join()
        back = time.time()
        for sender in senders:
            sender.join()
        answered = self.wait_answered(asked, 30)
        figures = self.after_outage(back, self.chat_base + chats)
        self.quiet()
        figures.update(self.counted(asked))
        figures.update({"all_answered": answered, "backends_killed": killed,
                        "worker_log_lines": self.log_lines(offset, self.log_offset())})
        return figures

    def sqlite_lock(self, hold=5.0, sqlite_timeout=1.0, chats=10):
        from django.db import connection

        self.channel()
        self.start(SQLITE_TIMEOUT=sqlite_timeout)
        path = connection.settings_dict["NAME"]
        asked = {self.chat_base + i: f"Question {i}: may I bring my dog?" for i in range(chats)}
        first = dict(list(asked.items())[: chats // 2])
        for chat_id, question in first.items():  # their buffers fall due while the lock is held
            self.deliver(chat_id, question)
        connection.close()
        holder = sqlite3.connect(path, isolation_level=None, timeout=30)
        offset = self.log_offset()
        holder.execute("BEGIN IMMEDIATE")
        locked = time.time()
        senders = [threading.Thread(target=self.deliver, args=item) for item in list(asked.items())[chats // 2:]]
        for sender in senders:
            sender.start()
        time.sleep(hold)
        holder.execute("ROLLBACK")
        holder.close()
        released = time.time()
        end_offset = self.log_offset()
        for sender in senders:
            sender.join()
        answered = self.wait_answered(asked, 30)
        figures = self.after_outage(released, self.chat_base + chats)
        self.quiet()
        figures.update(self.counted(asked))
        figures.update({"all_answered": answered, "locked_seconds": round(released - locked, 2),
                        "worker_log_lines_per_second": round(self.log_lines(offset, end_offset) / hold, 1)})
        return figures


# --- the figures ------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.faults.outage")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="only these (repeatable); default: restart and slow-turn")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    names = args.scenario or ["restart", "slow-turn"]
    figures = {}
    postgres = [n for n in names if n in POSTGRES_SCENARIOS]
    if postgres:
        cluster = Cluster()
        try:
            figures.update(run_on_cluster(cluster, postgres))
        finally:
            cluster.stop()
    if "sqlite-lock" in names:
        with sqlite_url() as url:
            figures.update(run_scenarios(url, ["sqlite-lock"]))
    for name in names:
        print(f"{name}:")
        for key, value in figures[name].items():
            print(f"  {key}: {value}")
    return 0


def run_on_cluster(cluster, names, timeout=300, **params):
    os.environ["AGENTLOOP_OUTAGE_PGDIR"] = cluster.dir
    try:
        return run_scenarios(cluster.url, names, timeout, **params)
    finally:
        os.environ.pop("AGENTLOOP_OUTAGE_PGDIR", None)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_child"]:
        sys.exit(child(sys.argv[2:]))
    sys.exit(main())
