"""The supervisor: starts the worker's jobs, and stops them in order.

Threads: the flusher is a plain thread sleeping until the earliest deadline (timing
matters there and must not queue behind turn work); turns, replies, file fetches and pollers are
asyncio tasks on one event loop (agent calls are I/O-bound: hundreds run at once);
their database steps run on a few database threads, each with its own connection.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Protocol

from django.conf import settings

from agentloop.core.backoff import DATABASE_FAULTS
from conversations import engine, liveness
from conversations.agents import agent_for
from conversations.platforms import typing_kinds
from conversations.worker.dbthread import DatabaseThread, until_answered
from conversations.worker.flusher import Flusher
from conversations.worker.housekeeping import Housekeeping
from conversations.worker.media import MediaFetcher
from conversations.worker.polling import Polling
from conversations.worker.replies import Replies
from conversations.worker.tool_calls import ToolCalls
from conversations.worker.turn_runner import TurnRunner
from conversations.worker.typing import Typing
from delivery import transports
from tools import guard

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 10.0


class Liveness(Protocol):
    """What the worker asks of its liveness (conversations.liveness.for_worker: a lock, or none)."""

    def holding(self) -> bool: ...

    async def start_holding(self) -> None: ...

    def stop(self) -> None: ...


class Worker:
    def __init__(self, *, owner: str | None = None, poll_interval: float | None = None,
                 max_concurrent: int | None = None, typing_interval: float | None = None,
                 max_typing: int | None = None, poll: bool = True) -> None:
        self.owner: str = owner or liveness.new_owner(lock=liveness.advisory())
        # Its liveness lock (PostgreSQL): while it does not hold it, it claims nothing.
        self.liveness: Liveness = liveness.for_worker(self.owner)
        self.poll_interval: float = poll_interval or settings.AGENTLOOP_POLL_INTERVAL
        # Turn claims and ledger sweeps that keep finding nothing look this often instead
        # (agentloop.core.backoff.IdlePoll); never faster than poll_interval.
        self.idle_poll_interval: float = max(self.poll_interval, settings.AGENTLOOP_IDLE_POLL_INTERVAL)
        self.max_concurrent: int = max_concurrent or settings.AGENTLOOP_MAX_CONCURRENT_TURNS
        self.typing_interval: float = typing_interval or settings.AGENTLOOP_TYPING_INTERVAL
        self.poll = poll
        self.db = DatabaseThread("db")
        # Claiming ready turns has a thread of its own: a flushed turn starts without
        # queueing behind replies, history loads and sweeps on the main database thread.
        self.claim = DatabaseThread("claim")
        # A turn's history is read on a thread of its own too: behind the main database
        # thread's batches of replies it waited tens of ms before the model was asked.
        self.read = DatabaseThread("read")
        self.dead_owners: list[str] = []
        # Typing indicators: their own database thread, so a look never queues behind
        # (or delays) replies, history loads or the flusher.
        self.typing = Typing(self, cap=max_typing, interval=self.typing_interval)
        self.turns = TurnRunner(self)
        self.tools = ToolCalls(self, settings.AGENTLOOP_TOOL_THREADS)
        self.replies = Replies(self)
        self.media = MediaFetcher(self)
        self.polling = Polling(self)
        self.housekeeping = Housekeeping(self)
        self.flusher: Flusher | None = None  # made by run()
        self.stop_deadline: float | None = None  # event loop time by which shutdown gives up on the database
        # Made by run(), on its event loop: the jobs that use them run under it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._wakeup: asyncio.Event | None = None

    @property
    def turns_done(self) -> int:
        return self.turns.done

    # --- signals between the jobs ----------------------------------------------

    def wake(self) -> None:
        """Thread-safe: new turns may be ready, or a conversation's turn just ended."""
        assert self._loop is not None and self._wakeup is not None  # called once run() began
        self._loop.call_soon_threadsafe(self._wakeup.set)

    def wake_turns(self) -> None:
        assert self._wakeup is not None  # called once run() began
        self._wakeup.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep until woken (new turns may be ready) or `seconds` passed."""
        assert self._wakeup is not None  # called once run() began
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)
        except TimeoutError:
            pass
        self._wakeup.clear()

    def stopping(self) -> bool:
        assert self._stopping is not None  # called once run() began
        return self._stopping.is_set()

    def request_stop(self) -> None:
        assert self._loop is not None and self._stopping is not None  # called once run() began
        self._loop.call_soon_threadsafe(self._stopping.set)

    # --- main -------------------------------------------------------------------

    async def run(self, ready: threading.Event | None = None) -> None:
        loop = self._loop = asyncio.get_running_loop()
        stopping = self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        # Agents are imported on a thread meanwhile (the openai SDK alone takes a second
        # or more): a restarted worker takes over its predecessor's polling at once.
        imports = loop.run_in_executor(None, self.import_modules)
        await self.liveness.start_holding()  # before its stamp is on anything
        await self.housekeeping.first_round()  # recover dead workers' turns before anything else
        flusher = self.flusher = Flusher(self.owner, self.wake, self.poll_interval,
                                         adopt=lambda started: loop.call_soon_threadsafe(self.turns.adopt, started),
                                         capacity=self.turns.capacity)
        tasks = [asyncio.create_task(self.polling.loop())] if self.poll else []
        await imports
        await self.prepare()
        flusher.start()
        log.info("worker %s started", self.owner)
        if ready is not None:
            ready.set()
        jobs = [self.turns.loop(), self.replies.loop(), self.housekeeping.loop(), self.turns.cancel_loop(),
                self.typing.watch(), self.media.loop()]
        tasks += [asyncio.create_task(job) for job in jobs]
        await stopping.wait()
        await self.shutdown(tasks)

    @staticmethod
    def import_modules() -> None:
        for name in settings.AGENTLOOP_AGENTS:  # now, not inside the first turn
            agent_for(name)
        # Every platform's transport, now: not in the first typing look (typing_kinds()
        # imports them all there, on the database thread, while the first window is open:
        # 30-110 ms of CPU measured, which cost a window its indicators on a busy machine).
        # The shutdown imports them anyway (close_clients).
        typing_kinds()

    async def prepare(self) -> None:
        # The database may come and go meanwhile: each step waits for it.
        await self.db.persist(guard.ensure_policies)  # no policy row is written inside a turn
        await until_answered(self.tools.offered)
        for agent, config in await self.db.persist(engine.agents_in_use):
            try:
                await agent_for(agent).prepare(config)
            except Exception:
                log.exception("preparing agent %s failed", agent)

    async def shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        log.info("worker %s stopping", self.owner)
        loop = asyncio.get_running_loop()
        self.stop_deadline = loop.time() + 2 * SHUTDOWN_GRACE
        flusher = self.flusher
        assert flusher is not None  # run() made it before any job started
        flusher.stop()
        for task in tasks:
            task.cancel()
        await self.turns.stop(SHUTDOWN_GRACE)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.typing.stop()
        await self.polling.stop()
        await self.replies.stop(SHUTDOWN_GRACE)
        await transports.close_clients()
        # The flusher may be mid-flush, starting turns under this owner: it must be gone
        # before the heartbeat is, or those turns would stay RUNNING under nobody.
        await loop.run_in_executor(None, flusher.join, SHUTDOWN_GRACE)
        await self.turns.release_adopted()
        try:
            await self.db.persist(self.polling.release_leases, deadline=self.stop_deadline)
            await self.db.persist(engine.retire, self.owner, deadline=self.stop_deadline)
        except DATABASE_FAULTS:
            # The heartbeat stays: the next worker on this host sees the process gone
            # and takes over at once.
            log.warning("worker %s stopped without the database; its work is taken over on restart", self.owner)
        for thread in (self.db, self.claim, self.read, self.typing.db, self.tools):
            thread.close()
        await loop.run_in_executor(None, self.liveness.stop)  # last: its heartbeat is gone
