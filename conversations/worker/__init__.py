"""The worker loop: fires flushes on time, runs turns concurrently, sends replies,
runs the pollers of platforms that poll (Telegram), and recovers what dead workers left behind.

Several of these can run side by side (any number of processes): every piece of work
is claimed by compare-and-swap with this worker's owner stamp.

One module per job — `flusher` (debounce deadlines), `turn_runner` (turns),
`tool_calls`, `replies` (sending), `polling` (the platforms' pollers), `housekeeping`
(heartbeat, recovery) — started and stopped by `supervisor`; every database step runs
through `dbthread`, which never leaves a thread on a broken connection.
"""

from conversations.worker.dbthread import Batcher
from conversations.worker.flusher import Flusher
from conversations.worker.supervisor import Worker
from conversations.worker.turn_runner import APOLOGY

__all__ = ["APOLOGY", "Batcher", "Flusher", "Worker"]
