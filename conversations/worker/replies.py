"""Sending replies: rows this worker claimed (its own turns' replies, and what the
ledger sweeps find due), each outcome recorded in batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import transaction

from agentloop.core.backoff import DATABASE_FAULTS, Backoff, IdlePoll
from conversations.worker.dbthread import Batcher, until_answered
from delivery import ledger
from delivery.models import Outcome
from delivery.transports import SendResult

if TYPE_CHECKING:  # for annotations only
    from conversations.worker.supervisor import Worker
    from delivery.models import OutboundMessage

    # A send's outcome, to be recorded: the row claimed, what the platform said.
    SendOutcome = tuple[OutboundMessage, SendResult]

log = logging.getLogger(__name__)

SWEEP_BATCH = 500


class Replies:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner
        self.sends: set[asyncio.Task[None]] = set()  # replies being sent by the ledger sweeps
        self.record: Batcher[SendOutcome, None] = Batcher(worker.db, self.finish_sends)

    async def send(self, row: OutboundMessage) -> None:
        """Send a ledger row this worker has claimed and record the outcome. An error of
        our own counts as ambiguous (it may have gone out): resent later, labelled."""
        try:
            result = await ledger.send(row, db=self.worker.db)  # a long reply's chunks recorded as they go
        except Exception as exc:
            log.exception("sending ledger row %s failed", row.pk)
            result = SendResult.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__}: {exc}")
        # The outcome waits here while the database is away: a delivered mark lost
        # would make the reply go out again (labelled) after the attempt timeout.
        await until_answered(lambda: self.record((row, result)))

    def finish_sends(self, outcomes: list[SendOutcome]) -> list[None]:
        with transaction.atomic():
            ledger.finish_many(outcomes, self.owner)
        return [None] * len(outcomes)

    def send_in_background(self, rows: Iterable[OutboundMessage]) -> None:
        for row in rows:
            task = asyncio.create_task(self.send(row))
            self.sends.add(task)
            task.add_done_callback(self.sends.discard)

    async def boot_sweep(self) -> int:
        """At start: claim what dead owners left mid-send, what waits for a start (the
        last budgeted resend) and anything due, and send it (labelled where it may have
        gone out already). The claimed rows stay `attempting` under this worker for the
        whole send, so no runtime sweep can take them too."""
        total = 0
        while True:
            rows = await self.worker.db.persist(ledger.claim_due, self.owner, self.worker.dead_owners,
                                                SWEEP_BATCH, None, True)
            if not rows:
                break
            total += len(rows)
            self.send_in_background(rows)
        if total:
            log.info("boot sweep: %d ledger rows claimed for delivery", total)
        return total

    async def loop(self) -> None:
        """The runtime sweep: pending rows (written by other processes), failed rows whose
        timer is due (flood penalties, backoffs) and rows of owners that died meanwhile."""
        await self.boot_sweep()
        backoff = Backoff()
        # This worker's own replies are sent as their turns end, not found by this sweep:
        # it finds other processes' rows and retries' timers, so it slows down once it has
        # found nothing and sent nothing for a while (a paced drain keeps sends waiting for
        # their slots: busy throughout).
        pace = IdlePoll(self.worker.poll_interval, self.worker.idle_poll_interval)
        while True:
            rows = []
            try:
                if not self.worker.liveness.holding():  # taken for dead by the others: claim nothing
                    await asyncio.sleep(self.worker.poll_interval)
                    continue
                rows = await self.worker.db(ledger.claim_due, self.owner, self.worker.dead_owners, SWEEP_BATCH)
                backoff.reset()
                self.send_in_background(rows)
                if len(rows) == SWEEP_BATCH:
                    continue  # more due right now
            except DATABASE_FAULTS:
                await asyncio.sleep(backoff.next())  # reported once by the database thread
            except Exception:
                log.exception("ledger sweep failed")
                await asyncio.sleep(max(backoff.next(), 0.5))
            await asyncio.sleep(pace.after(bool(rows) or bool(self.sends)))

    async def stop(self, grace: float) -> None:
        """Let replies mid-send finish and be recorded (else: resent, labelled)."""
        if self.sends:
            await asyncio.wait(list(self.sends), timeout=grace)
