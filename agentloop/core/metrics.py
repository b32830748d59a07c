"""The Prometheus metrics of the three promises, defined once, in the bottom layer, so
that every app records its own at the one place each outcome is recorded.

In the product's processes these are prometheus-client's multiprocess values (see
agentloop.core.metrics_dir): an `inc()` or `observe()` is a few writes into a
memory-mapped file of the process, under a lock of the process. `GET /metrics`
(agentloop.console.metrics) sums every process's files and adds the figures read from the
database at scrape time (buffers open, turns ready, workers alive…).

A figure counted inside a transaction is counted when it commits (`after_commit`): a
rolled-back flush or claim counts nothing. docs/metrics.md lists every metric.
"""

import logging
from collections.abc import Callable

from django.db import transaction
from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

# --- a burst is one turn (conversations) ------------------------------------------------
TURNS_FLUSHED = Counter("agentloop_turns_flushed", "Buffers flushed into a turn, by why the buffer flushed "
                        "(window, max_wait, max_messages, media, control).", ["reason"])
BURSTS_MERGED = Counter("agentloop_bursts_merged", "Turns made of more than one message: bursts merged into one turn.")
MESSAGES_PER_TURN = Histogram("agentloop_messages_per_turn", "Messages merged into one turn.",
                              buckets=(1, 2, 3, 4, 5, 8, 13, 20, 50, 100, 200))
TURN_SECONDS = Histogram("agentloop_turn_duration_seconds", "From a turn's start to its end written down, by how "
                         "it ended (done, failed).", ["state"],
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
BOT_MESSAGES_IGNORED = Counter("agentloop_bot_messages_ignored", "Messages from bots a channel does not allow, "
                               "stored as context and not answered.")
LOOPS_BROKEN = Counter("agentloop_loops_broken", "Conversations the loop breaker paused: more agent replies than the "
                       "channel's bound within its window, without a human message.")

# --- an action asked twice is done once (tools) -----------------------------------------
ACTIONS_CLAIMED = Counter("agentloop_actions_claimed", "Effectful tool calls the guard let through (a new claim), "
                          "by tool.", ["tool"])
DUPLICATES_PREVENTED = Counter("agentloop_duplicates_prevented", "Tool calls the guard did not carry out again, by "
                               "tool and what the original was (duplicate, in_progress, uncertain, "
                               "awaiting_approval).", ["tool", "status"])

# --- every reply arrives at least once (delivery) ---------------------------------------
REPLY_ATTEMPTS = Counter("agentloop_reply_attempts", "Send attempts of ledger rows, by outcome (delivered, flood, "
                         "temporary, permanent, ambiguous, not_sent, channel_blocked).", ["outcome"])
REPLIES_RECOVERED = Counter("agentloop_replies_recovered", "Replies delivered with the recovery label (they may "
                            "have arrived twice).")
REPLIES_ABANDONED = Counter("agentloop_replies_abandoned", "Replies given up: their resends spent or too old, or "
                            "the ledger is off and the one try failed.")
DELIVERY_SECONDS = Histogram("agentloop_delivery_latency_seconds", "From a reply written into the ledger to its "
                             "delivery recorded.", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800,
                                                             7200, 86400))

# --- the database -----------------------------------------------------------------------
DATABASE_FAULTS = Counter("agentloop_database_faults", "Database outages a worker met (each counted once, at its "
                          "start, however many tries failed).")
DATABASE_FAULT_SECONDS = Counter("agentloop_database_fault_seconds", "Seconds workers spent with the database away "
                                 "(added when it comes back).")
DATABASE_FAILING = Gauge("agentloop_database_failing", "1 while a live worker process is retrying through a "
                         "database fault.", multiprocess_mode="livemax")
DATABASE_UNAVAILABLE_ANSWERS = Counter("agentloop_database_unavailable_responses", "Requests the web answered 503 "
                                       "because the database was away.")


def after_commit(record: Callable[..., object], *args: object) -> None:
    """Run `record(*args)` once the current transaction commits (at once outside one);
    never if it rolls back. A figure that cannot be written (the directory's disk full)
    is logged, never raised: counting must not fail the step that did the work."""
    def safely() -> None:
        try:
            record(*args)
        except Exception:
            log.exception("a metric could not be recorded")

    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(safely)
    else:
        safely()
