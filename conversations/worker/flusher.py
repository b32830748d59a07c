"""The flusher: a plain thread (timing matters here and must not queue behind turn
work) that fires debounce flushes on time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import IntegrityError, connection
from django.utils import timezone

from agentloop.core.backoff import DATABASE_FAULTS, Backoff
from conversations import flushing
from conversations.models import TurnState
from conversations.worker.dbthread import run_step, write_batch

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Turn

log = logging.getLogger(__name__)


class Flusher(threading.Thread):
    """Sleeps until the earliest buffer deadline (at most `poll_interval`), then claims
    every due buffer by compare-and-swap and turns it into a ready turn — and starts the
    turns that are first in line for its own worker, while it has room."""

    def __init__(self, owner: str, on_flush: Callable[[], None], poll_interval: float,
                 adopt: Callable[[list[Turn]], object] | None = None,
                 capacity: Callable[[], int] = lambda: 0) -> None:
        super().__init__(name="flusher", daemon=True)
        self.owner = owner
        self.on_flush = on_flush
        self.poll_interval = poll_interval
        # Turns this flusher just created are started here and handed to the worker's
        # loop at once: no wake-up, no second claim query, one write fewer to wait for.
        self.adopt = adopt
        self.capacity = capacity
        self.wakeup = threading.Event()
        self.stopping = threading.Event()
        self.flushed = 0
        # Whether the last look saw any open buffer (due, or with a deadline ahead): the
        # typing look (worker.typing) asks the database nothing while none is open.
        self.saw_open_buffers = False
        # The last look found a whole batch due: more were waiting, so the flushes are
        # late and the next batch may be bigger (dbthread.write_batch).
        self.behind = False

    def run(self) -> None:
        backoff = Backoff()
        try:
            while not self.stopping.is_set():
                self.wakeup.clear()
                try:
                    wait = run_step(self.step)
                    backoff.reset()
                except DATABASE_FAULTS:
                    # The database went away (reported once by run_step), or chose this
                    # step as a deadlock victim: the transaction rolled back whole.
                    wait = backoff.next()
                except Exception:
                    log.exception("flusher step failed")
                    wait = max(backoff.next(), 0.5)
                if backoff.delay:  # backing off: wake-ups must not cut the pause short
                    self.stopping.wait(wait)
                elif wait > 0:
                    self.wakeup.wait(wait)
        finally:
            connection.close()

    def step(self) -> float:
        """Flush what is due; return how long to sleep before the next look."""
        now = timezone.now()
        most = write_batch(behind=self.behind)
        due, deadline = flushing.look(now, most)
        self.behind = len(due) >= most
        if due:
            room = self.capacity() if self.adopt is not None else 0
            try:
                flushed = flushing.flush_many(due, now, owner=self.owner, start=room)
            except IntegrityError:
                # Another worker started a turn in one of these conversations meanwhile
                # (PostgreSQL): flush them as ready turns and let the queue decide.
                flushed = flushing.flush_many(due, now, owner=self.owner)
            self.flushed += len(flushed)
            started = [turn for turn in flushed if turn.state == TurnState.RUNNING]
            if started:
                assert self.adopt is not None  # only one that adopts asks for turns started (room > 0)
                self.adopt(started)
            if len(started) < len(flushed):
                # Only a turn born READY needs the claim query; waking the turn loop for
                # turns started here ran that query on every deadline, for nothing, in
                # the same process (the same GIL) as this timed thread.
                self.on_flush()
            self.saw_open_buffers = True
            return 0.0  # there may be more due right now
        # Asked with the `now` the due part used, not a fresh one: a deadline passing
        # between the two would be neither due nor ahead, and the flusher would sleep
        # past it to the next one.
        self.saw_open_buffers = deadline is not None
        wait = self.poll_interval
        if deadline is not None:
            wait = min(wait, (deadline - timezone.now()).total_seconds())
        return max(0.0, wait)

    def stop(self) -> None:
        self.stopping.set()
        self.wakeup.set()
