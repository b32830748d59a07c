"""Housekeeping: the heartbeat, the guard's sweep, what dead workers left behind
(their turns, their rows mid-send, external turns past their time), and the turns
stamped with this worker that it no longer holds."""

import asyncio
import logging

from conversations import engine, turns
from conversations.worker.dbthread import DATABASE_FAULTS
from delivery import ledger
from tools import guard

log = logging.getLogger(__name__)

HOUSEKEEPING_EVERY = 5.0


class Housekeeping:
    def __init__(self, worker):
        self.worker = worker
        self.owner = worker.owner

    async def round(self):
        db = self.worker.db
        await db(engine.beat, self.owner)
        await db(guard.sweep)
        self.worker.dead_owners = dead = await db(engine.dead_owners)
        await db(ledger.abandon_stale, None, dead)
        if await db(turns.release_external):
            self.worker.wake_turns()
        if dead:
            recovered = await db(engine.recover_turns, dead)
            if recovered:
                log.info("recovered %d turns from dead workers", len(recovered))
                self.worker.wake_turns()
        orphans = await db(self.worker.turns.give_back_orphans, self.worker.turns.held())
        if orphans:
            log.warning("gave back %d running turns this worker no longer held", len(orphans))
            self.worker.wake_turns()

    async def first_round(self):
        """At start, before anything else: wait for the database if it is away."""
        while True:
            try:
                return await self.round()
            except DATABASE_FAULTS:
                await asyncio.sleep(1.0)  # reported once by the database thread

    async def loop(self):
        while True:
            await asyncio.sleep(HOUSEKEEPING_EVERY)
            try:
                await self.round()
                await self.worker.db(engine.forget_workers, self.worker.dead_owners)
            except DATABASE_FAULTS:
                pass  # reported once by the database thread; the next round tries again
            except Exception:
                log.exception("housekeeping failed")
