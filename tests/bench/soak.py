"""The soak: the product as `make run` starts it (manage.py runall: uvicorn, the worker
loop, the django-q2 cluster; DEBUG off, INFO logging), 20 messages a second through the
inbound API for 10 minutes, every reply POSTed to a local callback server.

Printed: messages missing a reply and messages answered twice (want 0 and 0), and each
process's resident memory (VmRSS) growth in the second half of the run (want < 10 MB),
beside its growth in the first half (the reference: warming caches, the allocator
settling). A process that leaks per message grows in both halves alike.

    .venv/bin/python -m tests.bench soak                 # 10 minutes
    .venv/bin/python -m tests.bench soak --seconds 120   # a quick look
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

RATE = 20  # messages per second
CONTACTS = 200  # each contact writes every CONTACTS / RATE = 10 s: one turn per message
SECRET = "soak-callback-secret"
FULL_SECONDS = 600


class CallbackServer:
    """A local api-channel callback endpoint, counting replies per inbound message id.
    asyncio in a thread of its own: the worker opens a connection per reply, many at
    once, and http.server's accept loop (one per select, a thread per request) answered
    them late enough to trip the sender's deadline."""

    def __init__(self):
        self.replies = Counter()
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}/replies"

    def _serve(self, ready):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader, writer):
        try:
            while True:  # keep-alive: several replies may share a connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = json.loads(await reader.readexactly(length))
                with self.lock:
                    self.replies[body["reply_to"]] += 1
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def count(self):
        with self.lock:
            return Counter(self.replies)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


def restore_schedules():
    """The bench flushes its database; `make run` has django-q2's schedules (created by
    migrations), so the cluster does its routine sweeps during the soak too."""
    from types import SimpleNamespace

    from django.apps import apps
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.operations import RunPython

    for (_app, name), migration in MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items():
        if "schedule" in name:
            for operation in migration.operations:
                if isinstance(operation, RunPython):
                    operation.code(apps, SimpleNamespace(connection=connection))  # the database migrated


def rss_kb(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def descendants(root):
    """runall and every process under it, each named by what it runs."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += frontier
    return {pid: process_name(pid, root) for pid in found}


def process_name(pid, root):
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return f"gone:{pid}"
    text = " ".join(part.decode(errors="replace") for part in cmdline)
    if pid == root:
        return "runall"
    for needle, name in (("web_server", "web"), ("runloop", "worker"), ("qcluster", "tasks")):
        if needle in text:
            return name
    return text[:40]


def cluster_up(root, timeout=30):
    """Every process once django-q2 has forked its own (cluster, sentinel, pusher, monitor,
    workers), so each is measured from the start."""
    from django.conf import settings

    deadline = time.monotonic() + timeout
    while True:
        names = descendants(root)
        if (sum(name == "tasks" for name in names.values()) >= 4 + settings.Q_CLUSTER["workers"]
                or time.monotonic() > deadline):
            return names
        time.sleep(0.2)


def label(names):
    """Unique labels: the django-q2 cluster forks its pusher, monitor and workers."""
    seen, labels = Counter(), {}
    for pid, name in sorted(names.items()):
        seen[name] += 1
        labels[pid] = name if seen[name] == 1 else f"{name}/{seen[name] - 1}"
    return labels


def start_product(env_db_url, logs):
    import httpx

    from tests.bench.__main__ import free_port, wait_until

    port = free_port()
    # `make run`'s defaults: no DEBUG, INFO logging, the product's own URLs and poll interval.
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEBUG", "LOG_LEVEL", "AGENTLOOP_URLCONF", "AGENTLOOP_POLL_INTERVAL")}
    env.update({"DATABASE_URL": env_db_url, "PYTHONUNBUFFERED": "1"})
    log = open(logs / "soak-runall.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "runall", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=Path(__file__).resolve().parents[2], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise SystemExit(f"runall exited; see {logs / 'soak-runall.log'}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "runall's web server")
    from conversations.models import WorkerHeartbeat

    wait_until(lambda: WorkerHeartbeat.objects.exists(), 60, "runall's worker")
    return proc, base


def send(client, base, i):
    response = client.post(f"{base}/api/v1/channels/soak/messages", json={
        "message_id": f"s{i}", "contact": f"c{i % CONTACTS}", "text": f"¿soak {i}?"})
    return response.status_code


def bench_soak(seconds=None, report=print):
    import httpx

    from conversations.models import AgentKey, Channel
    from tests.bench.__main__ import LOGS, wait_until

    seconds = int(seconds or os.environ.get("BENCH_SOAK_SECONDS") or FULL_SECONDS)
    restore_schedules()
    callbacks = CallbackServer()
    channel = Channel.objects.create(slug="soak", kind="api", agent="echo", platform_settings={
        "callback_url": callbacks.url, "callback_secret": SECRET})
    _, key = AgentKey.objects.issue("soak", [channel])
    proc, base = start_product(os.environ["DATABASE_URL"], LOGS)
    statuses = Counter()
    samples = []  # (seconds into the run, {label: rss kB})
    try:
        labels = label(cluster_up(proc.pid))
        total = seconds * RATE
        marks = {0, total // 2, total - 1}  # RSS at the start, the half, the end
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:
            began = time.monotonic()
            for i in range(total):
                time.sleep(max(0.0, began + i / RATE - time.monotonic()))
                if i in marks:
                    samples.append((time.monotonic() - began, {name: rss_kb(pid) for pid, name in labels.items()}))
                statuses[send(client, base, i)] += 1
            sent_for = time.monotonic() - began
        sent = {f"s{i}" for i in range(total)}
        try:
            wait_until(lambda: set(callbacks.count()) >= sent, 120, "every reply at the callback")
        except SystemExit:
            pass  # counted as missing below
        time.sleep(2)  # a late second copy of a reply would arrive now
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
        callbacks.close()
    replies = callbacks.count()
    missing = sum(1 for i in sent if replies[i] == 0)
    doubled = sum(1 for i in sent if replies[i] > 1)
    report("soak", f"{total} messages at {RATE}/s for {sent_for:.0f} s through the inbound API under `make run`'s "
                   f"defaults (runall, DEBUG off), replies POSTed to a local callback: {missing} missing, "
                   f"{doubled} doubled (want 0 / 0); API answers {dict(statuses)}")
    (t0, start), (t1, half), (t2, end) = samples
    for name in sorted(start):
        if None in (start[name], half[name], end[name]):
            report("soak", f"  {name:10} exited during the run")
            continue
        first, second = (half[name] - start[name]) / 1024, (end[name] - half[name]) / 1024
        verdict = "ok" if second < 10 else "GROWS"
        report("soak", f"  {name:10} RSS {start[name] / 1024:6.1f} MB at start: second half {second:+6.1f} MB "
                       f"(want < 10 MB: {verdict}) vs first half {first:+6.1f} MB (reference)")
