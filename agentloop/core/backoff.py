"""Retrying through a fault without flooding the log: a back-off per loop, and one
process-wide log of database faults that writes a line when a fault starts, one now
and then while it lasts, and one when the database is back — never one per try (a
flusher retrying every 10 ms on a closed connection once wrote 140 lines a second)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError

from agentloop.core import metrics

# The worker's logger, where these lines always went (alerts may match on its name).
log = logging.getLogger("conversations.worker")

# What a database that went away raises; anything else is a bug or a conflict.
DATABASE_FAULTS = (OperationalError, InterfaceError)

FIRST_DELAY = 0.02
MAX_DELAY = 1.0  # the database's return is noticed within a second
REPORT_EVERY = 30.0


class Backoff:
    """The pause before a loop's next try: doubles from `first` up to `cap`; a success
    starts it over."""

    def __init__(self, first: float = FIRST_DELAY, cap: float = MAX_DELAY) -> None:
        self.first, self.cap = first, cap
        self.delay = 0.0

    def next(self) -> float:
        self.delay = min(self.cap, self.delay * 2 if self.delay else self.first)
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0


class IdlePoll:
    """The pause before a polling loop's next look: `busy` while its looks find work, and
    `idle` once they have found nothing for `patience` seconds, until one finds something
    again. A worker with nothing to do asked the database for ready turns and due replies
    twenty times a second each, for work its own flusher and turns hand it directly
    (woken, not polled); what only a poll finds (another process's rows, a retry's timer)
    is found at most `idle` seconds late."""

    def __init__(self, busy: float, idle: float, patience: float = 0.5) -> None:
        self.busy, self.idle = busy, max(busy, idle)
        self.empty_looks_before_idle = max(1, round(patience / busy)) if busy > 0 else 1
        self.empty_looks = 0

    def after(self, found: bool) -> float:
        """The pause after a look that found work (`found`) or nothing."""
        self.empty_looks = 0 if found else self.empty_looks + 1
        return self.idle if self.empty_looks > self.empty_looks_before_idle else self.busy


def fault_kind(exc: BaseException) -> str:
    """A short name for what went wrong, so a restart's burst of different messages
    ("terminating connection", "connection refused", "the connection is closed") is
    reported as a handful of kinds rather than one line per message."""
    text = str(exc).lower()
    for words, kind in ((("locked", "busy"), "database locked"),
                        (("refused", "could not connect", "starting up", "shutting down",
                          "no such file", "timeout expired", "could not translate"), "database unreachable"),
                        (("closed", "terminat", "lost", "broken", "reset", "eof"), "connection lost"),
                        (("deadlock", "serializ"), "transaction conflict")):
        if any(word in text for word in words):
            return kind
    return type(exc).__name__


class FaultLog:
    """Thread-safe; `clock` is injectable for tests."""

    def __init__(self, logger: logging.Logger = log, subject: str = "database", every: float = REPORT_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.subject, self.every, self.clock = logger, subject, every, clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the current fault started, or None while healthy
        self._reported: dict[str, float] = {}  # kind -> when it was last logged
        self._failures = 0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        kind, now = fault_kind(exc), self.clock()
        with self._lock:
            if self._since is None:
                self._since = now
                self.started()
            self._failures += 1
            last = self._reported.get(kind)
            if last is not None and now - last < self.every:
                return
            self._reported[kind] = now
            elapsed = now - self._since
        if last is None:
            self.logger.warning("%s fault (%s): %s; retrying with back-off", self.subject, kind,
                                _first_line(exc))
        else:
            self.logger.warning("%s still failing after %.0f s (%s): %s", self.subject, elapsed, kind,
                                _first_line(exc))

    def recovered(self) -> None:
        if self._since is None:  # the common case: no lock, no work
            return
        with self._lock:
            since = self._since  # read again under the lock: another thread may have ended it
            if since is None:
                return  # type: ignore[unreachable]  # mypy knows no other thread
            elapsed, failures = self.clock() - since, self._failures
            self._since, self._reported, self._failures = None, {}, 0
            self.ended(elapsed)
        self.logger.info("%s back after %.1f s (%d failed tries)", self.subject, elapsed, failures)

    def started(self) -> None:
        """A fault began (called under the lock)."""

    def ended(self, seconds: float) -> None:
        """The fault that began `seconds` ago is over (called under the lock)."""


class DatabaseFaultLog(FaultLog):
    """The worker's database faults, counted (agentloop_database_faults_total and
    _fault_seconds_total) and shown while they last (agentloop_database_failing)."""

    def started(self) -> None:
        metrics.DATABASE_FAULTS.inc()
        metrics.DATABASE_FAILING.set(1)

    def ended(self, seconds: float) -> None:
        metrics.DATABASE_FAULT_SECONDS.inc(seconds)
        metrics.DATABASE_FAILING.set(0)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


DATABASE = DatabaseFaultLog()
