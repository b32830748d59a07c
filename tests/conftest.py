"""Shared fixtures: channels, real processes (web server, worker loops) on the test
database, and the local fake Telegram Bot API server."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from conversations.models import AgentKey, Channel, WorkerHeartbeat

BASE_DIR = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.browser", "tests.redis_server"]


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Poll `predicate` until it is truthy; return its value or fail with `message`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url():
    """The test database, as a URL the child processes can open."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def is_postgres():
    return connection.vendor == "postgresql"


class Process:
    def __init__(self, name, args, env, log_dir):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(args, cwd=BASE_DIR, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def pid(self):
        return self.popen.pid

    def output(self):
        return self.log_path.read_text(errors="replace")

    def kill(self):
        """SIGKILL: the crash the recovery paths exist for."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout=20):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()
        return self.popen.returncode


class Processes:
    """Starts the product's real processes against the test database."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.started: list[Process] = []

    def env(self, **extra):
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "agentloop.settings",
            "AGENTLOOP_POLL_INTERVAL": "0.02",
            "AGENTLOOP_TYPING_INTERVAL": "0.5",
            "AGENTLOOP_TELEGRAM_POLL_TIMEOUT": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, name, args, **env):
        proc = Process(f"{name}-{len(self.started)}", args, self.env(**env), self.log_dir)
        self.started.append(proc)
        return proc

    def worker(self, wait=True, **env):
        proc = self.start("worker", [sys.executable, "manage.py", "runloop"], **env)
        if wait:
            wait_until(lambda: proc.popen.poll() is not None or WorkerHeartbeat.objects.filter(pid=proc.pid).exists(),
                       timeout=30, message=f"worker {proc.pid} heartbeat")
            assert proc.popen.poll() is None, proc.output()
        return proc

    def web(self, **env):
        port = free_port()
        proc = self.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                  "agentloop.asgi:application"], **env)
        proc.url = f"http://127.0.0.1:{port}"

        def healthy():
            assert proc.popen.poll() is None, proc.output()
            try:
                return httpx.get(f"{proc.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=30, message="web server /healthz")
        return proc

    def stop_all(self):
        for proc in reversed(self.started):
            proc.stop()


@pytest.fixture(autouse=True)
def fresh_channel_cache():
    """Each test's channels, tool policies and live listeners are new rows (rolled back
    after), never a cached copy."""
    from agentloop.live import forget_listeners
    from tools.guard import forget_policies

    Channel.objects.forget_cached()
    forget_policies()
    forget_listeners()
    yield
    Channel.objects.forget_cached()
    forget_policies()
    forget_listeners()


@pytest.fixture
def make_conversation(db):
    from conversations.models import Contact, Conversation

    def make(channel, contact="ana"):
        person = Contact.objects.create(channel=channel, platform_id=contact, display_name=contact.title())
        return Conversation.objects.create(channel=channel, contact=person, chat_id=contact, sender_id=contact)

    return make


@pytest.fixture
def processes(transactional_db, tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
def make_channel(db):
    def make(slug="chan", **fields):
        fields.setdefault("kind", "api")
        return Channel.objects.create(slug=slug, **fields)

    return make


@pytest.fixture
def agent_key(db):
    def issue(*channels, name="agent"):
        return AgentKey.objects.issue(name, channels)[1]

    return issue


@pytest.fixture
def fake_telegram():
    from tests.fakes.telegram_api import FakeBotAPI

    with FakeBotAPI() as fake:
        yield fake
