"""The sustained benchmark's local Bot API keeps every call in the benchmark's own process;
`tests.bench.sustained.FrozenHistory` freezes that heap as it grows, so the collector's
full collections never stop the Bot API for longer as the run goes on (the stops would
count as the product's latency). The benchmark itself is never run by `make test`."""

import gc

from tests.bench.sustained import FrozenHistory
from tests.conftest import wait_until


def test_what_the_run_keeps_is_frozen_as_it_grows_and_the_freezing_stops_with_the_run():
    before = gc.get_freeze_count()
    kept = []
    try:
        with FrozenHistory(every=0.01) as frozen:
            kept.extend([n] for n in range(1000))  # containers the collector tracks, as recorded calls are
            wait_until(lambda: gc.get_freeze_count() >= before + len(kept), timeout=10,
                       message="the kept objects frozen")
        assert not frozen.thread.is_alive()
        after = gc.get_freeze_count()
        kept.extend([n] for n in range(1000))
        gc.collect(0)
        # Nothing frozen once the run is over. The count may fall: a frozen object that
        # another thread of this process lets go of (a fake server's, a finished test's)
        # leaves the permanent generation (CI saw 3 fewer).
        assert gc.get_freeze_count() <= after
    finally:
        gc.unfreeze()
