"""Failed sends logged once per fault, not once per try: a platform away for a minute with a
thousand replies queued is one line when it starts (per channel and kind of outcome),
one now and then while it lasts, and one when a send gets through again. A fault that
flaps (failures between successes) is still one line per kind every REPORT_EVERY."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentloop.core.caches import BoundedCache

if TYPE_CHECKING:
    from delivery.transports import SendResult

log = logging.getLogger("delivery.ledger")

REPORT_EVERY = 30.0


class SendFaults:
    """Thread-safe; `clock` is injectable for tests."""

    def __init__(self, every: float = REPORT_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self._lock = threading.Lock()
        # channel slug -> [since, failures]; (slug, outcome) -> when last logged, kept across
        # a recovery so a flapping fault is not a line per flap. Bounded: slugs are
        # operators', but a bound costs nothing.
        self._open: BoundedCache[str, list[float]] = BoundedCache(maxsize=1024)
        self._logged: BoundedCache[tuple[str, str], float] = BoundedCache(maxsize=4096)

    def failed(self, channel: object, result: SendResult) -> None:
        now, slug = self.clock(), getattr(channel, "slug", "?")
        with self._lock:
            fault = self._open.get(slug)
            if fault is None:
                fault = self._open.set(slug, [now, 0])
            fault[1] += 1
            last = self._logged.get((slug, result.outcome))
            if last is not None and now - last < self.every:
                return
            self._logged.set((slug, result.outcome), now)
            since = fault[0]
        if last is None or now - since < self.every:
            log.warning("sends of channel %s failing (%s): %s", slug, result.outcome, result.error)
        else:
            log.warning("sends of channel %s still failing after %.0f s (%s): %s", slug, now - since,
                        result.outcome, result.error)

    def recovered(self, channel: object) -> None:
        slug = getattr(channel, "slug", "?")
        if slug not in self._open:  # the common case: nothing to say
            return
        now = self.clock()
        with self._lock:
            fault = self._open.pop(slug)
            last = self._logged.get((slug, "back"))
            quiet = fault is not None and (last is None or now - last >= self.every)
            if quiet:
                self._logged.set((slug, "back"), now)
        if quiet and fault is not None:  # (quiet: a fault was open)
            log.info("sends of channel %s back after %.1f s (%d failed sends)", slug, now - fault[0], fault[1])


SENDS = SendFaults()
failed, recovered = SENDS.failed, SENDS.recovered
