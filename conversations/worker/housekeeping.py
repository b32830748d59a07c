"""Housekeeping: the heartbeat, the guard's sweep, scheduled messages now due, the planner's
statistics of tables that doubled (PostgreSQL), what dead workers left behind
(their turns, their rows mid-send, files they were fetching, external turns past
their time), and the turns
stamped with this worker that it no longer holds.

Dead workers are looked for every DEATH_CHECK_EVERY seconds when liveness comes from
advisory locks (a dead worker's lock frees at once: looking only every few seconds
would be what keeps its work waiting), the rest every HOUSEKEEPING_EVERY."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING

from agentloop.core import planner_stats
from agentloop.core.backoff import DATABASE_FAULTS
from conversations import engine, handoff, liveness, schedules, turns
from conversations.media import fetching
from conversations.models import Contact, Conversation, InboundMessage, MessageBuffer, Turn
from delivery import ledger
from delivery.models import OutboundMessage
from tools import guard
from tools.mcp import catalog

if TYPE_CHECKING:  # for annotations only
    from conversations.worker.supervisor import Worker

log = logging.getLogger(__name__)

HOUSEKEEPING_EVERY = 5.0
# Two statements (heartbeats, pg_locks) a second per worker; a turn of a dead worker is
# given back within this of its lock freeing, and its rows mid-send are claimed by the
# next ledger sweep (every AGENTLOOP_POLL_INTERVAL) after that.
DEATH_CHECK_EVERY = 1.0
# The tables every message grows: their planner statistics kept up with them while they
# are young (agentloop.core.planner_stats).
GROWING = tuple(model._meta.db_table for model in (InboundMessage, MessageBuffer, Turn, Conversation, Contact,
                                                   OutboundMessage))


class Housekeeping:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner

    async def round(self) -> None:
        db = self.worker.db
        await db(engine.beat, self.owner)
        await db(guard.sweep)
        await self.worker.tools.threads(catalog.refresh_due)  # MCP servers' tool lists, on their schedule
        await self.take_over_dead()
        await db(ledger.abandon_stale, None, self.worker.dead_owners)
        await db(fetching.release_expired)
        await db(schedules.send_due)  # written to the ledger: the replies' sweep sends them
        if await db(turns.release_external):
            self.worker.wake_turns()
        if await db(handoff.give_back_idle):  # a person quiet for the channel's idle time
            self.worker.wake_turns()
        # On a tool thread (a connection of its own), not in the way of the replies' steps.
        analyzed = await self.worker.tools.threads(planner_stats.refresh, GROWING)
        if analyzed:
            log.info("statistics refreshed for %s (grown past twice the planner's count)", ", ".join(analyzed))
        orphans = await db(self.worker.turns.give_back_orphans, self.worker.turns.held())
        if orphans:
            log.warning("gave back %d running turns this worker no longer held", len(orphans))
            self.worker.wake_turns()

    async def take_over_dead(self) -> None:
        """Find dead workers: the ledger's sweeps claim their rows mid-send from this
        list; their running turns are given back (run again, or failed with a notice)
        here. Their buffers need nothing: any flusher flushes a due buffer."""
        db = self.worker.db
        self.worker.dead_owners = dead = await db(engine.dead_owners)
        if dead and self.worker.liveness.holding():  # a worker the others may think dead takes nothing over
            await db(fetching.release_expired, None, dead)  # files it was fetching: fetched again
            recovered = await db(engine.recover_turns, dead)
            if recovered:
                log.info("recovered %d turns from dead workers", len(recovered))
                self.worker.wake_turns()

    async def first_round(self) -> None:
        """At start, before anything else: wait for the database if it is away."""
        while True:
            try:
                return await self.round()
            except DATABASE_FAULTS:
                await asyncio.sleep(1.0)  # reported once by the database thread

    async def loop(self) -> None:
        tick = DEATH_CHECK_EVERY if liveness.advisory() else HOUSEKEEPING_EVERY
        every = max(1, round(HOUSEKEEPING_EVERY / tick))
        for n in itertools.count(1):
            await asyncio.sleep(tick)
            try:
                if n % every:
                    await self.take_over_dead()
                    continue
                await self.round()
                await self.worker.db(engine.forget_workers, self.worker.dead_owners)
            except DATABASE_FAULTS:
                pass  # reported once by the database thread; the next round tries again
            except Exception:
                log.exception("housekeeping failed")
