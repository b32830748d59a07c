"""The peer benchmark: agentloop beside the Vercel Chat SDK (4.41, burst mode) on the same
Telegram workload, with the same load client (tests/bench/loadgen.py) and the same local
Bot API server (tests/fakes/telegram_api.py) for both.

Workload: 16 keep-alive clients POST Telegram webhook updates, a new chat each message;
every message is flushed when its window closes and answered by an echo handler, whose
reply goes to the local Bot API server. agentloop runs as `make run` runs it (manage.py
runall: uvicorn, the worker loop, the django-q2 cluster; DEBUG off, INFO logging), on
SQLite and on PostgreSQL (DATABASE_URL when it names one, else a throwaway cluster from
scripts/pg.sh); its channel's agent is `echo`. The peer is tests/bench/peer/bot.mjs on
in-memory state and on a throwaway redis-server; its handler posts the merged burst.

Per system: accepted webhook POSTs/s, POST p50/p99, errors, messages answered exactly
once, and whether it survives SIGKILL mid-burst (20 messages accepted, their windows
still open; every process of the system killed; restarted; how many of the 20 are
answered). Then agentloop / the peer's best configuration for POSTs/s and p99, and every
system's steady state side by side with the load client's own ceiling: the same client
against a bare Node HTTP server answering 200 at once (peer_run.BareNode).

What the peer does on SIGKILL (seen with redis-cli): the SDK answers 200 before the
message is even queued (the handler task is fired and forgotten). On memory state the
burst is gone. On Redis the messages stay queued (one list per chat, 90 s TTL) behind a
dead lock (30 s TTL), the webhook update marked seen for 24 h; nothing dispatches them
after a restart: only a later message from the same chat, after the lock lapses and
before the queue expires, drains the old one into its `context.skipped`.

The run and its report: tests/bench/peer_run.py.

    .venv/bin/python -m tests.bench peer
    BENCH_PEER_MESSAGES=500 .venv/bin/python -m tests.bench peer   # a quick look

Skipped, with a note, where `node` is missing. Not part of `make test`
(tests/end_to_end/test_bench_peer.py only checks that the peer bot answers).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.bench.loadgen import percentile

BASE_DIR = Path(__file__).resolve().parents[2]
PEER_DIR = Path(__file__).resolve().parent / "peer"
LOGS = BASE_DIR / "var" / "bench-logs"
SECRET = "peer-bench-secret"
MESSAGES = 2000  # the burst, per system (BENCH_PEER_MESSAGES overrides)
SUSTAINED = 10.0  # seconds of load for the steady state, per system (BENCH_PEER_SECONDS overrides)
WARMUP = 200
SPAN = 100_000  # message numbers per system: warm-up, burst and steady state from its start, the kill at its end
KILL_BURST = 20
CONCURRENCY = 16
ONE_CHAT_EACH = 10 ** 9  # loadgen's --conversations: chat = 1_000_000 + i, never reused
AFTER_RESTART = 20.0  # seconds a restarted system gets to answer the killed burst (windows <= 4 s)
ANSWER_TIMEOUT = 300.0
PEER_DEBOUNCE = 1.5  # seconds: the peer bot's burst debounce (tests/bench/peer/bot.mjs), agentloop's open window here
SPIKE_LATER = 5.0  # seconds after the load stopped: the share answered by then (issue 57's table)
SPIKE_ANSWER_WITHIN = 5.0  # seconds: every accepted message answered within this of its acceptance (issue 57)


# --- the peer ----------------------------------------------------------------------------

def ensure_node_modules():
    """`npm ci` from the lockfile when the packages are not installed yet, by one process
    at a time (the suite may run two peer-bot tests at once: `npm ci` first deletes
    node_modules, so a second one would pull it from under the first)."""
    import fcntl

    with open(PEER_DIR / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (PEER_DIR / "node_modules" / "chat" / "package.json").exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefix", str(PEER_DIR)], check=True,
                           capture_output=True, timeout=300)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc, url, log, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(proc.args[:2])} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up within {timeout:.0f} s; see {log}")
        time.sleep(0.05)


class System:
    """One system under test: its processes in a session of their own, so a SIGKILL of the
    session's process group kills every one of them at once, as a power cut would."""

    name = "system"
    window = 0.0  # seconds a message waits by design before its reply (the debounce)
    hook_path = ""

    def __init__(self, token, log_name):
        self.token = token
        self.log = LOGS / f"{log_name}.log"
        self.proc = None
        self.url = ""

    def command(self, port):
        raise NotImplementedError

    def env(self, port):
        return dict(os.environ)

    def start(self):
        LOGS.mkdir(parents=True, exist_ok=True)
        port = free_port()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(port), cwd=BASE_DIR, env=self.env(port), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        wait_up(self.proc, self.url, self.log)
        return self

    @property
    def hook(self):
        return f"{self.url}{self.hook_path}"

    def kill(self):
        """SIGKILL every process of the system, and wait until they are gone."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()


class Peer(System):
    hook_path = "/webhooks/telegram"

    def __init__(self, token, api_url, state="memory", redis_url="", debounce_ms=None):
        super().__init__(token, f"peer-{state}")
        self.api_url, self.state, self.redis_url, self.debounce_ms = api_url, state, redis_url, debounce_ms
        self.name = f"Chat SDK 4.41 burst, {state} state"
        self.window = (debounce_ms if debounce_ms is not None else PEER_DEBOUNCE * 1000) / 1000  # the SDK's burst debounce

    def command(self, port):
        return ["node", str(PEER_DIR / "bot.mjs")]

    def env(self, port):
        env = {**os.environ, "PEER_PORT": str(port), "PEER_STATE": self.state, "REDIS_URL": self.redis_url,
               "TELEGRAM_BOT_TOKEN": self.token, "TELEGRAM_WEBHOOK_SECRET_TOKEN": SECRET,
               "TELEGRAM_API_BASE_URL": self.api_url}
        if self.debounce_ms is not None:
            env["PEER_DEBOUNCE_MS"] = str(self.debounce_ms)
        return env


class Agentloop(System):
    hook_path = "/webhooks/telegram/bench-peer/"

    def __init__(self, token, api_url, database_url, label):
        super().__init__(token, f"peer-agentloop-{label}")
        self.database_url = database_url
        self.name = f"agentloop (make run, {label})"
        # The load's messages end in a conjunction ("mensaje N y"): each waits the channel's
        # open window — here the peer's debounce, 1.5 s, so that what a person waits past it
        # compares the systems, not their windows (the product's default is 4 s: a person
        # who writes "and" has more to say; BENCH_PEER_WINDOW=4 measures with it).
        self.window = float(os.environ.get("BENCH_PEER_WINDOW") or PEER_DEBOUNCE)
        self.database = label
        self.manage("migrate", "--verbosity", "0")
        self.manage("addchannel", "bench-peer", "--kind", "telegram", "--token", token, "--secret", SECRET,
                    "--api-base", api_url, "--mode", "webhook", "--agent", "echo", "--window-open", str(self.window),
                    # Unpaced: the local Bot API keeps no limits and the Chat SDK paces nothing;
                    # this compares intake, not Telegram's 30 messages/s (bench `paced` does).
                    "--messages-per-second", "0", "--chat-interval", "0", "--group-messages-per-minute", "0",
                    # Typing as the peer's handler does it: the peer starts no indicator (its
                    # handler posts the reply at once), and agentloop's `turn` mode shows one
                    # only while an agent runs longer than typing.TURN_GRACE, which the echo
                    # never does. `instant` (a new channel's default) also types through every
                    # open window: BENCH_PEER_TYPING=instant measures what that costs here.
                    "--typing-mode", os.environ.get("BENCH_PEER_TYPING", "turn"))

    def env(self, port=None):
        # `make run`'s defaults: no DEBUG, INFO logging, the product's own URLs and poll interval.
        env = {k: v for k, v in os.environ.items()
               if k not in ("DEBUG", "LOG_LEVEL", "AGENTLOOP_URLCONF", "AGENTLOOP_POLL_INTERVAL",
                            "TELEGRAM_BOT_TOKEN")}
        return {**env, "DATABASE_URL": self.database_url, "PYTHONUNBUFFERED": "1"}

    def manage(self, *args):
        subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=self.env(), check=True,
                       capture_output=True)

    def command(self, port):
        return [sys.executable, "manage.py", "runall", "--host", "127.0.0.1", "--port", str(port)]


@contextmanager
def redis_server():
    """A throwaway redis-server (no persistence), its URL."""
    from tests.support.ports import free_port
    from tests.support.redis_server import _ping

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agentloop-peer-redis-") as workdir, \
            open(LOGS / "peer-redis-server.log", "wb") as log:
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", workdir], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10
            while not _ping(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def no_redis():
    yield ""


@contextmanager
def throwaway_postgres():
    """A PostgreSQL cluster from scripts/pg.sh under /tmp (the postgres user must reach it),
    its URL; None (with the reason printed) where it cannot be started."""
    pgdir = tempfile.mkdtemp(prefix="agentloop-pg-peer-", dir="/tmp")
    try:
        url = subprocess.run([str(BASE_DIR / "scripts" / "pg.sh"), "start", pgdir], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (subprocess.CalledProcessError, OSError) as error:
        print(f"[peer] PostgreSQL run skipped: scripts/pg.sh start failed ({error})", flush=True)
        shutil.rmtree(pgdir, ignore_errors=True)
        yield None
        return
    try:
        yield url
    finally:
        subprocess.run([str(BASE_DIR / "scripts" / "pg.sh"), "stop", pgdir], capture_output=True)


# --- the workload ------------------------------------------------------------------------

def load(system, offset, *how, concurrency=CONCURRENCY):
    """Updates through the shared load client, a new chat each; `how`: --n N or --seconds S
    (and loadgen's other options)."""
    args = [sys.executable, "-m", "tests.bench.loadgen", "--url", system.hook, *how, "--offset", str(offset),
            "--concurrency", str(concurrency), "--conversations", str(ONE_CHAT_EACH),
            "--header", f"X-Telegram-Bot-Api-Secret-Token: {SECRET}"]
    out = subprocess.run(args, cwd=BASE_DIR, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def post_updates(system, n, offset):
    """n updates."""
    return load(system, offset, "--n", str(n))


def post_for(system, seconds, offset):
    """As many updates as the system takes in `seconds`."""
    return load(system, offset, "--seconds", str(seconds))


def sent_chats(run, offset):
    """The chats of a timed run's messages."""
    return {chat_of(offset, c, k) for c, n in enumerate(run["per_client"]) for k in range(n)}


def chat_of(offset, client, k):
    """The chat of connection `client`'s k-th message in a timed run (number offset + c + k * CONCURRENCY)."""
    return str(1_000_000 + offset + client + k * CONCURRENCY)


def chats(n, offset):
    """The chat ids loadgen gives updates offset .. offset + n - 1, as the Bot API sees them."""
    return {str(1_000_000 + i) for i in range(offset, offset + n)}


def replies(fake, token, wanted):
    """sendMessage calls per chat, for the chats in `wanted`."""
    counts = Counter(str(call.params.get("chat_id")) for call in fake.calls("sendMessage", token=token))
    return {chat: counts[chat] for chat in wanted}


def wait_answered(fake, token, wanted, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(replies(fake, token, wanted).values()):
            break
        time.sleep(0.2)
    return replies(fake, token, wanted)


def measure(system, fake, messages, offset):
    """Warm up, then the measured run; every message must be answered exactly once."""
    warm = post_updates(system, WARMUP, offset)
    wait_answered(fake, system.token, chats(WARMUP, offset), ANSWER_TIMEOUT)
    offset += WARMUP
    run = post_updates(system, messages, offset)
    wait_answered(fake, system.token, chats(messages, offset), ANSWER_TIMEOUT)
    time.sleep(2)  # a late second copy of a reply would arrive now
    answered = replies(fake, system.token, chats(messages, offset))
    return {"rate": run["rate"], "p50": run["p50_ms"], "p99": run["p99_ms"],
            "errors": run["errors"] + warm["errors"], "statuses": run["statuses"], **exactly_once(answered)}


def exactly_once(answered):
    """{chat: replies} as the messages answered once, not at all, and more than once."""
    return {"once": sum(1 for c in answered.values() if c == 1),
            "missing": sum(1 for c in answered.values() if c == 0),
            "doubled": sum(1 for c in answered.values() if c > 1)}


def sustained(system, fake, offset, seconds):
    """The steady state (issue 57's spike): `seconds` of load, its replies competing with
    the intake for the same cores. Accepted POSTs/s and their latencies over the window,
    the replies that reached the Bot API within it (and how many were still owed when it
    ended), what a person waited (`waits`), then every message answered exactly once
    however long the rest takes."""
    run = load(system, offset, "--seconds", str(seconds), "--accepted-at")
    wanted = sent_chats(run, offset)
    window = run["ended"] - run["began"]
    in_window = sum(1 for call in fake.calls("sendMessage", token=system.token)
                    if run["began"] <= call.at <= run["ended"] and str(call.params.get("chat_id")) in wanted)
    wait_answered(fake, system.token, wanted, ANSWER_TIMEOUT)
    drained = time.monotonic() - run["ended"]
    time.sleep(2)  # a late second copy of a reply would arrive now
    answered = replies(fake, system.token, wanted)
    return {"rate": run["rate"], "p50": run["p50_ms"], "p99": run["p99_ms"], "errors": run["errors"],
            "seconds": window, "replies_rate": in_window / window, "owed_at_end": len(wanted) - in_window,
            "drained": drained, "waits": waits(run, fake, system.token, offset), **exactly_once(answered)}


def waits(run, fake, token, offset):
    """What a person waited in the spike: from the moment their message's POST was answered
    (the platform holds it) to their reply's sendMessage at the Bot API, per accepted
    message; and the share answered when the load stopped and SPIKE_LATER seconds after."""
    accepted = {chat_of(offset, c, k): at
                for c, times in enumerate(run["accepted_at"]) for k, at in enumerate(times) if at is not None}
    first = {}
    for call in fake.calls("sendMessage", token=token):
        chat = str(call.params.get("chat_id"))
        if chat in accepted:
            first[chat] = min(call.at, first.get(chat, call.at))
    waited = sorted(first[chat] - at for chat, at in accepted.items() if chat in first)
    ended, total = run["ended"], max(len(accepted), 1)
    return {"accepted": len(accepted), "answered": len(waited),
            "at_end": sum(1 for at in first.values() if at <= ended) / total,
            "later": sum(1 for at in first.values() if at <= ended + SPIKE_LATER) / total,
            "p50": percentile(waited, 50), "p99": percentile(waited, 99), "max": waited[-1] if waited else None,
            "within": sum(1 for wait in waited if wait <= SPIKE_ANSWER_WITHIN) / total}


def survives_sigkill(system, fake, offset):
    """KILL_BURST messages accepted while their windows are open, every process of the
    system SIGKILLed, the system restarted: how many of them get answered (once)."""
    burst = post_updates(system, KILL_BURST, offset)
    wanted = chats(KILL_BURST, offset)
    before = sum(1 for c in replies(fake, system.token, wanted).values() if c)
    system.kill()
    system.start()
    answered = wait_answered(fake, system.token, wanted, AFTER_RESTART)
    return {"accepted": KILL_BURST - burst["errors"], "before_kill": before,
            "answered": sum(1 for c in answered.values() if c), "doubled": sum(1 for c in answered.values() if c > 1)}


def run_system(system, fake, messages, seconds, offset):
    system.start()
    try:
        figures = measure(system, fake, messages, offset)
        figures["steady"] = sustained(system, fake, offset + WARMUP + messages, seconds)
        figures["kill"] = survives_sigkill(system, fake, offset + SPAN - KILL_BURST)
    finally:
        system.stop()
    figures["name"], figures["database"] = system.name, getattr(system, "database", "")
    figures["window"] = system.window
    return figures


def agentloop_databases():
    """(label, DATABASE_URL) pairs: SQLite always (its own file), PostgreSQL from
    DATABASE_URL when it names one, else a throwaway cluster."""
    sqlite = BASE_DIR / "var" / "bench-peer.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{sqlite}{suffix}").unlink(missing_ok=True)
    yield "SQLite", f"sqlite:///{sqlite}"
    given = os.environ.get("DATABASE_URL", "")
    if given.startswith("postgres"):
        yield "PostgreSQL", given
        return
    with throwaway_postgres() as url:
        if url:
            yield "PostgreSQL", url
