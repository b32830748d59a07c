"""The web side while the database is away: 503 with Retry-After (Telegram and API
clients retry), never a 500 with a trace, nothing half-admitted; once the database is
back the same requests are admitted, once.

Real processes: daphne serving the product, and — on PostgreSQL — a throwaway cluster
of this test's own that is stopped and started again (the shared test server is never
touched); on SQLite, another process holding the write lock longer than SQLITE_TIMEOUT.
"""

import json
import subprocess
import sys
import tempfile
import time

import httpx
import psycopg

from conversations.models import AgentKey, Channel, InboundMessage
from tests.conftest import BASE_DIR, is_postgres, run_python, wait_until

SECRET = "outage-secret"
HOOK_HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET}


def telegram_update(update_id, chat=4242):
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": f"mensaje {update_id}",
        "from": {"id": chat, "is_bot": False, "first_name": "Ana"},
        "chat": {"id": chat, "type": "private", "first_name": "Ana"}}}


class Client:
    """The two inbound doors: a Telegram webhook update and an inbound API message."""

    def __init__(self, base_url, agent_key):
        self.http = httpx.Client(base_url=base_url, timeout=20)
        self.api_headers = {"Authorization": f"Bearer {agent_key}"}

    def post_both(self, n):
        hook = self.http.post("/webhooks/telegram/tg/", json=telegram_update(n), headers=HOOK_HEADERS)
        api = self.http.post("/api/v1/channels/api/messages", headers=self.api_headers,
                             json={"message_id": f"api-{n}", "contact": "bea", "text": f"hola {n}"})
        return hook, api


def stored_ids(n, chat=4242):
    """The platform ids the two doors store message `n` under."""
    return [f"{chat}:{n}", f"api-{n}"]


def assert_unavailable(response):
    assert response.status_code == 503, (response.status_code, response.text[:500])
    assert int(response.headers["Retry-After"]) > 0
    assert response.json() == {"ok": False, "error": "database unavailable, retry later"}
    assert "Traceback" not in response.text


def assert_admitted(hook, api, duplicate):
    assert hook.status_code == 200, hook.text[:500]
    assert hook.json() == {"ok": True, "duplicate": duplicate}
    assert api.status_code == 202, api.text[:500]
    assert api.json()["duplicate"] is duplicate


def test_web_answers_503_while_the_database_is_away_then_admits_once(processes):
    if is_postgres():
        _postgres_restarted(processes)
    else:
        _sqlite_write_lock_held(processes)


# --- PostgreSQL: the server stops and starts again -------------------------------------

SETUP_CHANNELS = """
from conversations.models import AgentKey, Channel
Channel.objects.create(slug="tg", kind="telegram", platform_settings={"bot_token": "1:OUTAGE", "webhook_secret": "%s"})
api = Channel.objects.create(slug="api", kind="api")
print(AgentKey.objects.issue("outage", [api])[1])
""" % SECRET


def _manage(url, *args):
    return run_python([sys.executable, "manage.py", *args], env=_env(url), check=True, timeout=300).stdout


def _env(url):
    import os

    return {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "agentloop.settings"}


def _count(url, platform_message_id):
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM conversations_inboundmessage WHERE platform_message_id = %s",
                            [platform_message_id]).fetchone()[0]


def _pg(command, directory):
    return subprocess.run([str(BASE_DIR / "scripts/pg.sh"), command, directory], capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def _postgres_restarted(processes):
    # Under /tmp: the postgres user must reach it even when the clone is private.
    directory = tempfile.mkdtemp(prefix="agentloop-pg-outage-", dir="/tmp")
    url = _pg("start", directory)
    try:
        _manage(url, "migrate", "--noinput", "-v0")
        key = _manage(url, "shell", "-c", SETUP_CHANNELS).strip().splitlines()[-1]
        web = processes.web(DATABASE_URL=url)
        client = Client(web.url, key)
        assert_admitted(*client.post_both(1), duplicate=False)  # up: admitted

        _pg("down", directory)
        for _ in range(10):  # an outage: every request fails the same way
            for response in client.post_both(2):
                assert_unavailable(response)
        health = client.http.get("/healthz")
        assert_unavailable(health)  # the load balancer sees it too
        assert web.popen.poll() is None

        _pg("up", directory)
        assert_admitted(*client.post_both(2), duplicate=False)  # Telegram's retry, the client's retry
        assert_admitted(*client.post_both(2), duplicate=True)
        assert [_count(url, platform_id) for platform_id in stored_ids(2)] == [1, 1]
        # Logged once per kind of fault per interval, not once per request.
        assert web.output().count("database unavailable, answering 503") <= 2, web.output()[-3000:]
        assert "Traceback" not in web.output()
    finally:
        processes.stop_all()
        _pg("stop", directory)


# --- SQLite: another process holds the write lock --------------------------------------

RAW_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""

# One of our own processes (a worker, a shell) stuck inside a write transaction: it
# holds the file lock our SQLite backend queues writers on as well as SQLite's.
DJANGO_HOLDER = """
import sys
from django.db import transaction
from conversations.models import Channel
with transaction.atomic():
    Channel.objects.filter(slug="tg").update(name="held")
    print("held", flush=True)
    sys.stdin.readline()
"""


def _hold(args, env):
    holder = subprocess.Popen(args, cwd=BASE_DIR, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline().strip()
    if line != "held":
        holder.kill()
        raise AssertionError(f"the lock holder did not start: {line!r}")
    return holder


def _release(holder):
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(30) == 0


def _sqlite_write_lock_held(processes):
    from django.db import connection

    Channel.objects.create(slug="tg", kind="telegram", platform_settings={
        "bot_token": "1:OUTAGE", "webhook_secret": SECRET})
    api = Channel.objects.create(slug="api", kind="api")
    _, key = AgentKey.objects.issue("outage", [api])
    web = processes.web(SQLITE_TIMEOUT="1")
    client = Client(web.url, key)
    assert_admitted(*client.post_both(1), duplicate=False)

    holders = {
        "a plain sqlite3 process": [sys.executable, "-c", RAW_HOLDER, connection.settings_dict["NAME"]],
        "one of our processes": [sys.executable, "manage.py", "shell", "-v", "0", "-c", DJANGO_HOLDER],
    }
    for n, (who, args) in enumerate(holders.items(), start=2):
        holder = _hold(args, processes.env())
        try:
            began = time.monotonic()
            for response in client.post_both(n):
                assert_unavailable(response)
            # Each waited SQLITE_TIMEOUT (1 s), not forever.
            assert time.monotonic() - began < 10, who
            assert not InboundMessage.objects.filter(platform_message_id__in=stored_ids(n)).exists(), who
        finally:
            _release(holder)
        assert_admitted(*client.post_both(n), duplicate=False)
        assert_admitted(*client.post_both(n), duplicate=True)
        assert InboundMessage.objects.filter(platform_message_id__in=stored_ids(n)).count() == 2, who
    wait_until(lambda: "database unavailable, answering 503" in web.output(), message="the 503 logged")
    assert "Traceback" not in web.output()
    assert json.loads(client.http.get("/healthz").text) == {"ok": True}
