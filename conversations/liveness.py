"""Whether a worker is alive, told by the database itself.

advisory (AGENTLOOP_LIVENESS, PostgreSQL's default): each worker holds a session-level
advisory lock, keyed by its owner stamp, on a connection of its own (`LockHolder`). The
lock lives exactly as long as that session: it frees the moment the worker's process
dies (the kernel closes its socket, the server ends the session), and within about
AGENTLOOP_LIVENESS_TIMEOUT seconds when its host drops off the network (the session's
own TCP keepalives and tcp_user_timeout, set on the server's side of it, give up on the
silent peer). Other workers read pg_locks (`released`): an owner that says it holds a
lock (its stamp ends in LOCK_MARK) and whose key nobody holds is dead — whatever its
heartbeat says, and however old that is. Except within `grace()` of the server's start
or of the looking worker's own lock session: a database restart ends every session at
once, and each worker needs a moment to take its lock again.

heartbeat (SQLite; or chosen): a worker is dead when its heartbeat row is older than
AGENTLOOP_WORKER_STALE_AFTER. An owner stamp without the mark (that mode, or a worker of
an older release during an upgrade) is always judged this way, so both kinds can run
side by side.

A worker whose own lock connection breaks is, to the others, dead: they take over its
turns, rows mid-send and polling leases. So while it does not hold its lock it claims
nothing new (`holding()` gates its claims) and reconnects to take its lock again. What
it had in flight is protected by the compare-and-swap claims it already relies on: a
turn's end is written only `where owner = it and state = running` (a turn taken over is
no longer its, so its answer is dropped and the new run's stands); a reply's outcome is
recorded only where its claim still holds (a row taken over is another's); a polling lease is
renewed only `where poll_owner = it`; an effect is claimed in the guard before it runs
(a re-run finds the claim). The worst case is a reply sent by both, the second one
labelled as a possible duplicate — the ledger's promise.

Behind a transaction-mode pooler (PgBouncer pool_mode=transaction) a session lock is
meaningless: the lock stays on whichever server connection ran the statement, which
outlives the worker. Give the lock a session of its own with
AGENTLOOP_LIVENESS_DATABASE_URL (PostgreSQL itself, or a session-mode pool), or set
AGENTLOOP_LIVENESS=heartbeat. A lock connection that lands on a pooled session is
noticed: each ping asks whether *this* session holds the key, and a "no" drops the lock
with an error naming the setting.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import environ
import psycopg
from django.conf import settings
from django.db import connection, connections

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

    LockConnection = psycopg.Connection[TupleRow]

log = logging.getLogger(__name__)

LOCK_MARK = "L"  # the last field of an owner stamp whose worker holds a lock
PING_EVERY = 1.0  # seconds between the lock connection's checks
RECONNECT_CAP = 2.0  # longest pause between a lost lock connection's tries
# Options of Django's that are not libpq connection parameters.
_DJANGO_ONLY = {"pool", "server_side_binding", "isolation_level", "assume_role", "prepare_threshold",
                "cursor_factory", "context"}

# The server's uptime, and every advisory lock held in this database (a bigint key shows
# as classid = its high 32 bits, objid = its low 32; int8's << keeps the low 64 bits).
HELD_KEYS_SQL = """
    SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8,
           ARRAY(SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND objsubid = 1
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
"""
MINE_SQL = """
    SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
                   AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s)
"""


def advisory() -> bool:
    return settings.AGENTLOOP_LIVENESS == "advisory" and connection.vendor == "postgresql"


def marks_lock(owner: str) -> bool:
    """Whether `owner`'s stamp says its worker holds a liveness lock."""
    parts = owner.split(":")
    return len(parts) == 5 and parts[4] == LOCK_MARK


def lock_key(owner: str) -> int:
    """The owner's lock: 64 bits of a hash of its stamp (stamps carry random bits, so
    two workers never share one), as PostgreSQL's signed bigint."""
    digest = hashlib.blake2b(owner.encode(), digest_size=8, person=b"agentloop-live").digest()
    return int.from_bytes(digest, "big", signed=True)


def _halves(key: int) -> tuple[int, int]:
    """pg_locks shows a bigint advisory key as classid (high 32 bits) and objid (low)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def grace() -> float:
    """How long after the database restarts (or this process's own lock session began)
    a free lock is not taken for a death: every worker lost its session with the
    server's restart, and each needs up to this long to notice, reconnect and take its
    lock again. Lock holders are judged a moment later, that is all."""
    timeout: float = settings.AGENTLOOP_LIVENESS_TIMEOUT
    return PING_EVERY + RECONNECT_CAP + timeout


def held_keys() -> tuple[float, set[int]]:
    """The server's uptime in seconds, and every advisory lock held in this database
    now, by any session (one statement)."""
    with connection.cursor() as cursor:
        cursor.execute(HELD_KEYS_SQL)
        uptime, keys = cursor.fetchone()
        return uptime, set(keys)


def released(owners: Iterable[str]) -> set[str] | None:
    """Those of `owners` that say they hold a lock and do not: dead. Read after the
    owners themselves (their heartbeat rows, the stamps on their claims): a worker takes
    its lock before it writes or claims anything, so a stamp seen with its lock free is
    a worker gone.

    None off PostgreSQL (no locks to read: heartbeats judge). Nobody, for now, within
    `grace()` of the server's start or of this process's own lock session, or while this
    process's worker does not hold its lock (it may be the one cut off)."""
    if connection.vendor != "postgresql":
        return None
    marked = {owner for owner in owners if marks_lock(owner)}
    if not marked or _own_lock_too_young():
        return set()
    uptime, held = held_keys()
    if uptime < grace():
        return set()
    return {owner for owner in marked if lock_key(owner) not in held}


_own: list[LockHolder] = []  # this process's worker's LockHolder, once it runs


def _own_lock_too_young() -> bool:
    return any(holder.held_for() < grace() for holder in _own)


# --- the worker's own lock ------------------------------------------------------------

def lock_connection_params() -> dict[str, Any]:
    """libpq parameters for the lock's connection: the database's own (or
    AGENTLOOP_LIVENESS_DATABASE_URL's), with short TCP timeouts so that this process
    notices a dead network as fast as the server does."""
    source: Mapping[str, Any]
    if settings.AGENTLOOP_LIVENESS_DATABASE_URL:
        source = environ.Env.db_url_config(settings.AGENTLOOP_LIVENESS_DATABASE_URL)
    else:
        source = connections["default"].settings_dict
    params = {k: v for k, v in (source.get("OPTIONS") or {}).items() if k not in _DJANGO_ONLY}
    params.update(dbname=source.get("NAME"), user=source.get("USER"), password=source.get("PASSWORD"),
                  host=source.get("HOST"), port=source.get("PORT"))
    timeout = settings.AGENTLOOP_LIVENESS_TIMEOUT
    params.update(connect_timeout=max(2, timeout), keepalives=1, keepalives_idle=1, keepalives_interval=1,
                  keepalives_count=max(1, timeout - 1), tcp_user_timeout=timeout * 1000,
                  application_name="agentloop liveness")
    return {k: v for k, v in params.items() if v not in (None, "")}


def server_timeouts_sql() -> str:
    """The same timeouts on the server's side of the session: these decide how soon the
    server ends the session of a host that vanished — and so frees its lock."""
    timeout = settings.AGENTLOOP_LIVENESS_TIMEOUT
    return (f"SET tcp_keepalives_idle = 1; SET tcp_keepalives_interval = 1; "
            f"SET tcp_keepalives_count = {max(1, timeout - 1)}; SET tcp_user_timeout = {timeout * 1000}; "
            f"SET statement_timeout = {timeout * 1000}")


def wedged_after() -> float:
    """A worker whose event loop has not answered its lock thread for this long is wedged
    (the loop is asked every PING_EVERY: never less than a few of those)."""
    stale_after: float = settings.AGENTLOOP_WORKER_STALE_AFTER
    return max(stale_after, 5 * PING_EVERY)


class LockHolder(threading.Thread):
    """Takes the worker's lock on a connection of its own and keeps checking that it
    still holds it; reconnects and takes it again when the connection breaks.

    It also lets the lock go when the worker's event loop stops answering for
    AGENTLOOP_WORKER_STALE_AFTER seconds (`wedged_after`) (a wedged process holds its connection open
    forever, but does no work: the others should take over), and takes it again once
    the loop answers."""

    def __init__(self, owner: str) -> None:
        super().__init__(name="liveness", daemon=True)
        self.owner = owner
        self.key = lock_key(owner)
        self.conn: LockConnection | None = None
        self.backend_pid: int | None = None  # the server session holding the lock
        self._held_since: float | None = None  # time.monotonic() when it was (re)taken
        self._held = threading.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._vouched = time.monotonic()
        self._refusals = 0

    def holding(self) -> bool:
        return self._held.is_set()

    def held_for(self) -> float:
        """Seconds this lock has been held on its current session (0 when not held)."""
        since = self._held_since
        return time.monotonic() - since if self.holding() and since is not None else 0.0

    async def start_holding(self) -> None:
        """Start the thread and wait until the lock is ours (while the database is away:
        as long as that takes — nothing may be claimed before)."""
        self._loop = asyncio.get_running_loop()
        self._vouched = time.monotonic()
        _own.append(self)  # this process's own: its age decides when locks may judge others
        self.start()
        while not self.holding():
            await asyncio.sleep(0.05)

    def _vouch(self) -> None:
        self._vouched = time.monotonic()

    def _loop_answers(self) -> bool:
        """Ask the event loop for a sign of life; whether it gave one recently (a holder
        started without a loop has none to watch)."""
        if self._loop is None:
            return True
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._vouch)
        return time.monotonic() - self._vouched < wedged_after()

    def run(self) -> None:
        delay = 0.0
        while not self._stopping.is_set():
            try:
                if not self._loop_answers():
                    if self.conn is not None:
                        self._drop(f"its event loop has not answered for {wedged_after():g} s")
                elif self.conn is None:
                    self._take()
                else:
                    self._check(self.conn)
                delay = 0.0
            except psycopg.Error as exc:
                self._drop(f"its connection failed ({type(exc).__name__})")
                delay = min(RECONNECT_CAP, delay * 2 or 0.1)  # back soon: meanwhile it claims nothing
            self._stopping.wait(max(delay, PING_EVERY if self.holding() else 0.2))
        self._let_go()

    def _let_go(self) -> None:
        """Stopping: unlock before closing, so the others see the lock free at once (a
        closed session's locks go only once the server has ended it)."""
        if self.conn is not None and self.holding():
            try:
                self.conn.execute("SELECT pg_advisory_unlock(%s::bigint)", [self.key])
            except psycopg.Error:
                pass  # the close below frees it anyway
        self._close()

    def _take(self) -> None:
        self.conn = conn = psycopg.connect(**lock_connection_params(), autocommit=True)
        conn.execute(server_timeouts_sql())
        if _answer(conn.execute("SELECT pg_try_advisory_lock(%s::bigint)", [self.key])):
            self.backend_pid = conn.info.backend_pid
            self._held_since = time.monotonic()
            self._held.set()
            self._refusals = 0
            log.info("worker %s holds its liveness lock", self.owner)
            return
        # Held by another session: most likely our own previous one, which the server
        # has not given up on yet (it will, within AGENTLOOP_LIVENESS_TIMEOUT).
        self._refusals += 1
        if self._refusals in (1, 30):
            log.warning("worker %s: its liveness lock is held by another session; waiting", self.owner)
        self._close()

    def _check(self, conn: LockConnection) -> None:
        classid, objid = _halves(self.key)
        if not _answer(conn.execute(MINE_SQL, [classid, objid])):
            log.error("worker %s: its lock connection's session does not hold its lock — is it behind a "
                      "transaction-mode pooler? Set AGENTLOOP_LIVENESS_DATABASE_URL to a direct connection "
                      "or AGENTLOOP_LIVENESS=heartbeat", self.owner)
            self._drop("the session does not hold the lock")

    def _drop(self, why: str) -> None:
        if self._held.is_set():
            log.warning("worker %s let go of its liveness lock: %s; it claims nothing until it holds it again",
                        self.owner, why)
        self._held.clear()
        self._close()

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()  # the server ends the session: the lock frees
            except Exception:
                pass

    def stop(self) -> None:
        """Let the lock go (last thing a worker does, after its heartbeat is gone)."""
        self._stopping.set()
        if self.is_alive():
            self.join(PING_EVERY + settings.AGENTLOOP_LIVENESS_TIMEOUT + 1)
        self._held.clear()
        if self in _own:
            _own.remove(self)


class NoLock:
    """A worker judged by its heartbeat alone: always free to claim."""

    def holding(self) -> bool:
        return True

    async def start_holding(self) -> None:
        return None

    def stop(self) -> None:
        return None


def _answer(cursor: psycopg.Cursor[TupleRow]) -> object:
    """The value a one-value statement (SELECT of one expression) answered."""
    row = cursor.fetchone()
    assert row is not None, "a SELECT without FROM answers one row"
    return row[0]


def for_worker(owner: str) -> LockHolder | NoLock:
    if not marks_lock(owner):
        return NoLock()
    if settings.DATABASE_TRANSACTION_POOLER and not settings.AGENTLOOP_LIVENESS_DATABASE_URL:
        # Refused before anything is claimed: through the pooler the lock would stay on a
        # pooled server session that outlives this worker (see the module's docstring).
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "DATABASE_TRANSACTION_POOLER=true: the worker's liveness lock needs a session of its own — set "
            "AGENTLOOP_LIVENESS_DATABASE_URL to PostgreSQL itself, or AGENTLOOP_LIVENESS=heartbeat")
    return LockHolder(owner)


# --- a worker's name ------------------------------------------------------------------

def new_owner(lock: bool = False) -> str:
    """`host:pid:start:random` — with the process's start time, so that a later process
    given the same pid (a restart in a container often is) is not taken for it. `lock`:
    its worker will hold a liveness lock (this module), said by a fifth
    field — so the others judge it by that lock, not by its heartbeat."""
    pid = os.getpid()
    owner = f"{settings.AGENTLOOP_HOSTNAME}:{pid}:{process_started(pid) or 0}:{os.urandom(3).hex()}"
    return f"{owner}:{LOCK_MARK}" if lock else owner


def process_started(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat, field
    22): with the pid, it names one process for the life of the host. None when there
    is no such process; "" when this system cannot tell (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") or not _pid_alive(pid) else ""
    except OSError:
        return ""
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_gone(owner: str, hostname: str | None = None, pid: int | None = None) -> bool:
    """Whether the worker behind `owner` is visibly gone: it ran on this host and its pid
    is free now or names a process started since, or it held a liveness lock that
    nobody holds now (any host: the database ended its session). Such an owner is dead
    at once — no need to wait for its heartbeat or leases to expire. Another host's
    owner without a lock is not judged here (its heartbeat tells)."""
    return gone_from_this_host(owner, hostname, pid) or owner in (released([owner]) or ())


def gone_from_this_host(owner: str, hostname: str | None = None, pid: int | None = None) -> bool:
    parts = owner.split(":")
    started: str | None = None
    if len(parts) in (4, 5) and parts[1].isdigit():  # new_owner()'s form
        hostname, pid, started = parts[0], int(parts[1]), parts[2]
    elif hostname is None and len(parts) == 3 and parts[1].isdigit():  # before start times
        hostname, pid = parts[0], int(parts[1])
    if hostname != settings.AGENTLOOP_HOSTNAME or pid is None:
        return False
    now_started = process_started(pid)
    if now_started is None:
        return True
    return bool(started and started != "0" and now_started and now_started != started)
