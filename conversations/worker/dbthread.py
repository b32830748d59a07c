"""One helper for every database step the worker's event loop runs: a thread (or a
few) with its own connection, which a failed step never leaves broken.

A connection that died under a step (PostgreSQL restarted, the backend killed, SQLite
locked past its timeout) is closed at once; the next step opens a fresh one. Without
this, every later step of the thread fails on "the connection is closed", forever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, ParamSpec, TypeVar, TypeVarTuple

from django.db import connection

from agentloop.core.backoff import DATABASE, DATABASE_FAULTS, Backoff
from agentloop.core.db_connection import close_after_fault, close_broken_connection, force_close, opened_before_a_fault

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
Args = TypeVarTuple("Args")
Item = TypeVar("Item")
Result = TypeVar("Result")


def run_step(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one step on the calling thread; a database fault closes its connection and
    is reported once per fault (see backoff.FaultLog), not once per try. A connection
    opened before a fault another thread met is replaced first, not probed
    (agentloop.core.db_connection)."""
    if opened_before_a_fault():
        force_close()
    try:
        result = fn(*args, **kwargs)
    except DATABASE_FAULTS as exc:
        close_after_fault()
        DATABASE.failed(exc)
        raise
    except Exception:
        close_broken_connection()
        raise
    DATABASE.recovered()
    return result


async def until_answered(call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
    """Await `call()` until the database answers: while it is away, try again, backing
    off — or until `deadline` (event loop time) has passed, then raise the last fault."""
    backoff = Backoff()
    while True:
        try:
            return await call()
        except DATABASE_FAULTS:
            delay = backoff.next()
            if deadline is not None and asyncio.get_running_loop().time() + delay > deadline:
                raise
            await asyncio.sleep(delay)


class DatabaseThread:
    """`await db(fn, *args)` runs `fn` on this helper's thread(s), each with its own
    connection."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.threads = threads
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(run_step, fn, *args, **kwargs))

    async def persist(self, fn: Callable[[*Args], T], *args: *Args,
                      deadline: float | None = None) -> T:
        """Run a step that must happen (a finished turn's end, a send's outcome): see
        `until_answered`."""
        return await until_answered(functools.partial(self, fn, *args), deadline)

    def close(self) -> None:
        """Close the thread's connection and stop it (waits for the step in progress)."""
        if self.threads == 1:
            self.executor.submit(force_close).result()
            self.executor.shutdown(wait=True)
        else:  # tools may be blocked on the outside world: do not wait for them
            self.executor.shutdown(wait=False, cancel_futures=True)


def write_batch(behind: bool = False) -> int:
    """How many items one of the worker's write transactions takes at most (a flush's
    buffers, a batch of finished turns or of delivery outcomes). SQLite has one write
    lock for the whole database, held from BEGIN to COMMIT, and the web process waits
    for it to admit a message: under the peer benchmark's steady load a flush of up to
    200 due buffers held it for up to 390 ms and a batch of finished turns up to 560 ms
    (their Python shares the worker's GIL with the event loop's sends), and the webhook
    POSTs' p99 was those waits. Smaller transactions, the web's admissions in between
    (docs/scaling.md). PostgreSQL locks rows: bigger batches, fewer round trips.

    `behind`: the work waiting is late (see SQLITE_CATCH_UP_BATCH). A worker that fell
    behind on SQLite takes bigger batches until it has caught up: the same rows in
    fewer transactions, each a little longer for the web to wait for."""
    if connection.vendor != "sqlite":
        return 200
    return SQLITE_CATCH_UP_BATCH if behind else SQLITE_WRITE_BATCH


SQLITE_WRITE_BATCH = 16
# A backlog, drained 16 rows a transaction, went down by a few dozen messages a second:
# in a 10-minute paced run at 212 messages/s on SQLite, a few seconds' slowdown eight
# minutes in (turns waiting for their end to be written) took a minute and a half to
# drain, the replies 10 s late meanwhile. In the closed loop (16 clients, 20 s), 64
# rows a transaction delivered 427-442 replies/s against 200-210/s at 16; fewer POSTs
# were accepted meanwhile (511-558 against 637-675/s, p99 76-83 against 52-55 ms).
SQLITE_CATCH_UP_BATCH = 64
# Work waiting longer than this is late: the batch grows (a batch of finished turns in
# the steady state above waited 0.04-0.06 s on average). At 0.5 s, a worker paced near
# what it sustains (337/s on SQLite) settled with its finished turns waiting just under
# that, every reply 0.4-0.5 s later than in its first two minutes.
BEHIND_SECONDS = 0.1


class Batcher(Generic[Item, Result]):
    """Collects calls made while the database thread is busy and runs them as batches
    (one transaction, one commit each, at most `write_batch()` items, more when the
    oldest has waited BEHIND_SECONDS) — hundreds of turns finishing together cost a
    handful of commits, not hundreds."""

    def __init__(self, db: DatabaseThread, fn: Callable[[list[Item]], Sequence[Result]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db, self.fn, self.clock = db, fn, clock
        self.pending: list[tuple[Item, asyncio.Future[Result], float]] = []  # (item, future, when it was asked for)
        self.running = False

    async def __call__(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.pending.append((item, future, self.clock()))
        if not self.running:
            self.running = True
            asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self.pending:
                most = write_batch(behind=self.clock() - self.pending[0][2] > BEHIND_SECONDS)
                batch, self.pending = self.pending[:most], self.pending[most:]
                try:
                    results = await self.db(self.fn, [item for item, *_ in batch])
                except Exception as exc:
                    for _, future, _ in batch:
                        future.set_exception(exc)
                    continue
                for (_, future, _), result in zip(batch, results):
                    future.set_result(result)
        finally:
            self.running = False
