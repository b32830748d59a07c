"""The product through PgBouncer in transaction mode (pool_mode = transaction), run, not
reasoned: a throwaway pgbouncer in front of the test database, the real web server and
worker processes with DATABASE_URL pointing through it, a burst of Telegram webhooks to
a local fake Bot API.

Every transaction may land on a different server connection there, so anything that
needs a session (server-side cursors outside a transaction, prepared statements, SET,
a session advisory lock) breaks. The liveness lock needs a session of its own
(AGENTLOOP_LIVENESS_DATABASE_URL, straight to PostgreSQL); the second test shows what
happens when it is pointed through the pooler anyway — the documented failure mode.

PostgreSQL pass only. pgbouncer refuses to run as root: as root it runs as the
`postgres` user in a folder that user owns (as scripts/pg.sh runs PostgreSQL). A missing
binary fails the test (scripts/system-deps.sh installs it), it is not a skip."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from audit.models import AuditEvent, EventKind
from conversations.models import InboundMessage, MessageBuffer, Turn, TurnState, WorkerHeartbeat
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import database_url, free_port, is_postgres, run_python, wait_until
from tests.support import local_http
from tests.support.e2e import SECRET, telegram_channel, update
from tools.models import ActionClaim, CalendarEvent, ClaimState

pytestmark = pytest.mark.e2e

POOL_SIZE = 10  # server connections per database/user: the web and worker share them
CONVERSATIONS = 40
AGENT = {"AGENTLOOP_EXTRA_AGENTS": "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}
# The same guarded call twice in one turn: carried out once, the second a duplicate.
CALLS = [{"name": "calendar_create_event", "arguments": EVENT}] * 2
POOLER_ERROR = "is it behind a transaction-mode pooler? Set AGENTLOOP_LIVENESS_DATABASE_URL"


def pgbouncer_binary():
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)


class PgBouncer:
    """A pgbouncer process of our own in front of the test database's server."""

    def __init__(self, binary, server_host, server_port, log_path):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentloop-pgbouncer-", dir="/tmp"))
        self.log_path = log_path
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={server_host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "users.txt"}
admin_users = postgres
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 1000
pidfile = {self.dir / "pgbouncer.pid"}
""")
        args = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # "PgBouncer should not run as root"
            shutil.chown(self.dir, "postgres")
            for path in self.dir.iterdir():
                shutil.chown(path, "postgres")
            args = ["runuser", "-u", "postgres", "--", *args]
        self.log = open(log_path, "wb")
        self.popen = subprocess.Popen(args, cwd="/", stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._answers, timeout=15, message=f"pgbouncer on port {self.port} ({log_path})")
        except BaseException:
            self.stop()
            raise

    def url(self, dbname):
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def _answers(self):
        assert self.popen.poll() is None, self.output()
        try:
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname=connection.settings_dict["NAME"], connect_timeout=2) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except psycopg.OperationalError:
            return False

    def show(self, what):
        """The admin console (simple query protocol only: a client-side cursor)."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="pgbouncer",
                             autocommit=True, cursor_factory=psycopg.ClientCursor, connect_timeout=5) as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def server_pids(self):
        return {row["remote_pid"] for row in self.show("SERVERS")}

    def output(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        """SIGTERM to pgbouncer itself (its pid file; runuser is only its parent): an
        immediate shutdown, every server connection closed, so the test database can be
        dropped."""
        pidfile = self.dir / "pgbouncer.pid"
        try:
            if pidfile.exists():
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            else:
                self.popen.terminate()
            self.popen.wait(15)
        except (ProcessLookupError, ValueError):
            pass
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        finally:
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def bouncer(processes, tmp_path):
    """Requested after `processes`, so it stops after the product's processes did."""
    if not is_postgres():
        pytest.skip("PgBouncer runs in the PostgreSQL pass")
    binary = pgbouncer_binary()
    if binary is None:
        pytest.fail("pgbouncer is not installed: run scripts/system-deps.sh as root "
                    "(apt-get install pgbouncer); the PostgreSQL pass needs it")
    settings = connection.settings_dict
    pgb = PgBouncer(binary, settings["HOST"], settings["PORT"], tmp_path / "pgbouncer.log")
    try:
        yield pgb
    finally:
        processes.stop_all()
        pgb.stop()


def through(bouncer, **env):
    """A process's environment: its database through the pooler."""
    return {"DATABASE_URL": bouncer.url(connection.settings_dict["NAME"]),
            "DATABASE_TRANSACTION_POOLER": "true", **env}


def post(web, body):
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                          headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def backends_on_the_test_database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, application_name FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return dict(cursor.fetchall())


def advisory_lock_holders():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
                       "(SELECT oid FROM pg_database WHERE datname = current_database())")
        return {pid for (pid,) in cursor.fetchall()}


def test_a_burst_through_pgbouncer_is_answered_once_with_one_effect_per_conversation(
        processes, bouncer, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, agent="scripted", agent_config={"tool_calls": CALLS})
    direct = database_url()
    web = processes.web(wait=False, **through(bouncer))
    worker = processes.worker(**through(bouncer, AGENTLOOP_LIVENESS_DATABASE_URL=direct, **AGENT))

    # Two messages per conversation (the first ends in "y": its window waits for the
    # rest), 16 conversations at once, then every update delivered a second time.
    chats = range(5001, 5001 + CONVERSATIONS)
    pairs = [[update(chat, "Confirmo la hora de psicología y"), update(chat, "agéndala en mi calendario.")]
             for chat in chats]
    bodies = [body for pair in pairs for body in pair]
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        first = [answer for answers in pool.map(lambda pair: [post(web, body) for body in pair], pairs)
                 for answer in answers]
        ingest_seconds = time.monotonic() - started
        again = list(pool.map(lambda body: post(web, body), bodies))
    assert [answer["duplicate"] for answer in first] == [False] * len(bodies)
    assert [answer["duplicate"] for answer in again] == [True] * len(bodies)

    fake_telegram.wait_for("sendMessage", count=CONVERSATIONS, timeout=60)
    answered = time.monotonic() - started
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == CONVERSATIONS
               and not MessageBuffer.objects.exclude(state="flushed").exists()
               and not Turn.objects.exclude(state=TurnState.DONE).exists(),
               timeout=30, message="every reply recorded as delivered, nothing left open")
    time.sleep(0.5)  # a second reply would have been sent by now (the worker looks every 20 ms)

    replies = fake_telegram.calls("sendMessage")
    assert sorted(int(c.params["chat_id"]) for c in replies) == list(chats), "each conversation answered once"
    for reply in replies:  # the guarded call carried out once, then refused as a duplicate
        assert [json.loads(line)["status"] for line in reply.params["text"].splitlines()] == ["done", "duplicate"]
    assert InboundMessage.objects.count() == 2 * CONVERSATIONS
    assert Turn.objects.count() == CONVERSATIONS
    assert all(t.merged_input == "Confirmo la hora de psicología y\nagéndala en mi calendario."
               for t in Turn.objects.all())
    assert CalendarEvent.objects.count() == CONVERSATIONS
    assert ActionClaim.objects.filter(state=ClaimState.DONE).count() == ActionClaim.objects.count() == CONVERSATIONS
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == CONVERSATIONS

    # It all went through the pooler: every other session on the test database is one of
    # pgbouncer's server connections, except the worker's liveness lock, held on a
    # direct session of its own.
    owner = WorkerHeartbeat.objects.get(pid=worker.pid).owner
    backends = backends_on_the_test_database()
    servers = bouncer.server_pids()
    [lock_pid] = advisory_lock_holders()
    assert backends[lock_pid] == "agentloop liveness" and lock_pid not in servers
    assert set(backends) - {lock_pid} <= servers, (backends, servers)
    assert len(servers) <= POOL_SIZE
    stats = next(row for row in bouncer.show("STATS") if row["database"] == connection.settings_dict["NAME"])
    clients = [row for row in bouncer.show("CLIENTS") if row["database"] == connection.settings_dict["NAME"]]
    print(f"\nthrough pgbouncer (transaction mode): {len(bodies)} messages + {len(bodies)} redeliveries "
          f"(all refused as duplicates) from {CONVERSATIONS} conversations, ingest {ingest_seconds:.2f} s; "
          f"each answered once, {answered:.1f} s from the first webhook to the last reply; "
          f"{CONVERSATIONS} guarded calls carried out once each; {stats['total_xact_count']} transactions "
          f"from {len(clients)} client connections on {len(servers)} server connections (pool {POOL_SIZE})")
    for proc in (web, worker):
        assert "Traceback" not in proc.output(), proc.output()
    # Nothing the pooler refused (it logs a client's failed query as "pooler error").
    assert not [line for line in bouncer.output().splitlines() if " WARNING " in line or " ERROR " in line], \
        bouncer.output()
    assert "liveness lock" in worker.output() and POOLER_ERROR not in worker.output()
    assert owner.endswith(":L")


def test_a_liveness_lock_pointed_through_pgbouncer_is_noticed_and_let_go(processes, bouncer, make_channel):
    """The documented failure mode, made to happen: the worker's lock connection goes
    through the pooler too (no AGENTLOOP_LIVENESS_DATABASE_URL). Its lock is taken on
    whichever server connection ran that statement; the test then holds that very server
    connection in a transaction of its own, so the worker's next check must run on
    another one — whose session does not hold the lock. The worker logs the error naming
    the settings and lets go (it claims nothing), while the lock stays on the pooled
    connection, held by nobody's worker: why a pooled lock means nothing."""
    # An operator who did say DATABASE_TRANSACTION_POOLER is refused at start (below); one
    # who did not is caught at run time.
    worker = processes.worker(**through(bouncer, DATABASE_TRANSACTION_POOLER="false"))
    owner = WorkerHeartbeat.objects.get(pid=worker.pid).owner
    wait_until(lambda: advisory_lock_holders(), message="its lock taken")
    [lock_pid] = advisory_lock_holders()
    assert lock_pid in bouncer.server_pids()  # taken on a pooled server connection

    held, spare = None, []
    deadline = time.monotonic() + 15
    try:
        while held is None:  # borrow server connections until we hold the lock's one
            assert time.monotonic() < deadline and len(spare) < POOL_SIZE, "never got the lock's connection"
            conn = psycopg.connect(bouncer.url(connection.settings_dict["NAME"]), connect_timeout=5)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # opens a transaction
            if pid == lock_pid:
                held = conn
            else:
                spare.append(conn)
        for conn in spare:
            conn.close()
        spare = []
        # The lock connection's SETs (statement_timeout among them) may have stayed on a
        # pooled connection too; this one shows what it was left with.
        left_with = held.execute("SHOW statement_timeout").fetchone()[0]

        wait_until(lambda: POOLER_ERROR in worker.output(), timeout=10, message="the pooler error logged")
        wait_until(lambda: "let go of its liveness lock" in worker.output(), timeout=5, message="it let go")
        # The lock outlived the worker's lock session: still on the pooled connection, so
        # its next try (on another server connection) is refused and it waits.
        wait_until(lambda: "its liveness lock is held by another session" in worker.output(), timeout=10,
                   message="its retry refused")
        assert advisory_lock_holders() == {lock_pid}
        assert worker.popen.poll() is None
        print(f"\nlock through pgbouncer: worker {owner} logged the pooler error and let go of its lock; the "
              f"lock stayed on pooled server connection {lock_pid} (its statement_timeout: {left_with})")
    finally:
        for conn in spare + ([held] if held else []):
            conn.close()


def test_migrate_runs_through_pgbouncer_on_a_fresh_database(processes, bouncer):
    """Every migration runs in a transaction of its own on PostgreSQL (the data
    migration's iterator() included), so `migrate` needs no direct connection either."""
    fresh = f"{connection.settings_dict['NAME']}_migrate"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
        cursor.execute(f'CREATE DATABASE "{fresh}"')
    try:
        started = time.monotonic()
        migrate = run_python([sys.executable, "manage.py", "migrate", "--noinput"], timeout=300,
                             env=processes.env(DATABASE_URL=bouncer.url(fresh), DATABASE_TRANSACTION_POOLER="true"))
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        seconds = time.monotonic() - started
        check = run_python([sys.executable, "manage.py", "migrate", "--check"], timeout=120,
                           env=processes.env(DATABASE_URL=bouncer.url(fresh), DATABASE_TRANSACTION_POOLER="true"))
        assert check.returncode == 0, check.stdout + check.stderr  # nothing left unapplied
        applied = migrate.stdout.count("... OK")
        assert applied >= 20, migrate.stdout
        print(f"\nmigrate through pgbouncer (transaction mode): {applied} migrations applied in {seconds:.1f} s")
    finally:
        with connection.cursor() as cursor:  # pgbouncer's server connections to it are forced off
            cursor.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')


def test_a_worker_told_of_the_pooler_but_not_given_a_lock_session_refuses_to_start(processes, bouncer):
    """DATABASE_TRANSACTION_POOLER=true with the advisory lock and no direct URL for it:
    the worker stops before it claims anything, naming the two ways out."""
    worker = processes.worker(wait=False, **through(bouncer))
    wait_until(lambda: worker.popen.poll() is not None, timeout=60, message="the worker to refuse")
    assert worker.popen.returncode != 0
    assert "AGENTLOOP_LIVENESS_DATABASE_URL" in worker.output() and "AGENTLOOP_LIVENESS=heartbeat" in worker.output()
    assert not WorkerHeartbeat.objects.filter(pid=worker.pid).exists()
