"""Python's cyclic garbage collector, tuned for the worker loop (runloop).

By default a collection runs every 700 net allocations, and every tenth one also walks
the older generation. A burst allocates far more than that (500 turns ending together:
500 tasks, requests and answers, rows from the database), so collections ran over and
over while the burst was answered, each walking every object still alive. Measured
with `python -m tests.bench turns` on PostgreSQL (500 turns ending together, against
one turn), on one machine the same morning: 1.48-1.85x with the default collector (15
runs), 1.39-1.56x with the one below (12 runs), 1.46-1.48x with collection switched
off altogether (2 runs; not an option: reference cycles would grow without bound).
The web process showed no difference through the noise of tests.bench.cpu, so it keeps
the default.

So: what start-up built (Django, the apps, their modules: most of the heap, alive
until the process ends) is frozen out of every collection, and a collection waits for
50,000 net allocations. Memory stays bounded: cycles are still collected, in larger
and rarer rounds."""

import gc

YOUNG_THRESHOLD = 50_000


def tune_for_bursts() -> None:
    """Call once, after start-up has imported and built what it needs."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 100)
