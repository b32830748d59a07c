"""The delivery ledger: every reply at least once, every possible duplicate labelled.

A reply is written down (a pending row) in the transaction of the work that produced
it, before anything is sent. Whoever sends it first *claims* it: one compare-and-swap
moves it to `attempting`, stamps the owner and a claim token, counts the attempt — and,
in the same statement, decides from the row's state *before* the claim whether this
send must carry the recovery prefix: a row never claimed goes out plain; a row claimed
before may have arrived already, so it goes out labelled `♻️ Recovered reply`. A
labelled duplicate therefore always means one model run delivered twice, never two.

Outcomes (see `transports`): delivered; flood → retried when the penalty ends;
temporary or ambiguous → resent after 30 s, then 2 min, and the last budgeted resend is
kept for the next worker start (an outage longer than the timers never strands a
reply); permanent → the chat is marked unreachable and never retried; channel blocked
(the platform refused the channel's credentials) → the row waits, its attempt given
back, until an operator saves the channel again. Bounded: 3
resends (floods aside) and 24 h, then abandoned. Delivered and finished rows are pruned
after 7 days.

A row is claimable when it is pending, when it failed and its timer is due (or, at a
worker's start, its last resend waits for that start), or when it is attempting under
an owner that died (or held it longer than any send takes) — and only for channels
that can send now (active, and not blocked: Channel.send_blocked). The boot sweep
holds what it claims in `attempting` for the whole send, so no runtime sweep can take
it too.

The package, by section: `replies` (rows written down, the ledger's bounds), `claiming`,
`sending`, `outcomes`, `sweeps`; its hand-written statements are in `delivery.sql`. The
names below are the app's public interface, the one place it is declared: what the other
apps and the tests call (`from delivery.ledger import X`, `ledger.X`), and the django-q2
schedules' `delivery.ledger.safety_sweep` and `delivery.ledger.prune`. Everything else is
the package's own.
"""

from delivery.ledger.claiming import claim_due, claim_many, claim_written, holds_rows, new_token
from delivery.ledger.outcomes import finish, finish_many, mark_unreachable, release, resends_used
from delivery.ledger.replies import (
    BACKOFF,
    FRESHNESS,
    MAX_RESENDS,
    RECOVERY_PREFIX,
    RECOVERY_SIGN,
    Reply,
    enabled,
    enqueue,
    enqueue_many,
    parts,
    prefix_units,
    prepare_many,
    split_for,
    unrecorded,
)
from delivery.ledger.sending import note_progress, send, text_to_send
from delivery.ledger.sweeps import abandon, abandon_stale, channel_health, prune, retry_now, safety_sweep

__all__ = [
    "BACKOFF", "FRESHNESS", "MAX_RESENDS", "RECOVERY_PREFIX", "RECOVERY_SIGN", "Reply", "abandon", "abandon_stale",
    "channel_health", "claim_due", "claim_many", "claim_written", "enabled", "enqueue", "enqueue_many", "finish",
    "finish_many", "holds_rows", "mark_unreachable", "new_token", "note_progress", "parts", "prefix_units",
    "prepare_many", "prune", "release", "resends_used", "retry_now", "safety_sweep", "send", "split_for",
    "text_to_send", "unrecorded",
]
