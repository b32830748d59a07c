"""Named fault points: `failpoint("ledger.after_send")` kills this process with SIGKILL
when the environment names that point, and does nothing otherwise — the pattern of
FoundationDB's buggify and TiKV's fail-rs. The crash matrix (`python -m tests.faults`)
arms one point per run to prove that a crash between any two steps is recovered.

    AGENTLOOP_FAILPOINT=ledger.after_send          its first hit kills the process
    AGENTLOOP_FAILPOINT=ledger.after_send@3        its third hit does
    AGENTLOOP_FAILPOINT=inbound.after_insert,turn.after_answer@2

The variable is read once, at import: unset, a call costs one lookup in an empty
frozenset. The module lives in `audit`, the app every other app already imports, and
imports nothing of ours, so placing a point never makes imports run up.
"""

import os
import signal
import threading

from django.db import transaction

ENV = "AGENTLOOP_FAILPOINT"

# The points placed in the pipeline, in its order (the crash matrix runs each).
POINTS = (
    "inbound.after_insert",  # the message row inserted, its transaction not committed
    "flush.after_claim",  # buffers claimed and their turns born, committed; no turn started
    "turn.after_answer",  # the agent answered; the turn's completion not recorded
    "tool.after_claim",  # the guard's claim committed; the effect not run
    "tool.after_effect",  # the effect done; the claim not confirmed
    "ledger.after_claim",  # the reply's row attempting; nothing sent
    "ledger.after_send",  # the reply sent; the outcome not recorded
    "approval.between_steps",  # an operator's Apply: the claim taken; the effect not run
    "media.after_store",  # a user's file fetched and stored; not marked stored
    "ledger.after_upload",  # a reply's file uploaded; its outcome not recorded
)

# Per chunk of a long reply (only replies over the platform's limit cross them, so the
# crash matrix's short replies do not; tests/end_to_end/test_chunks.py arms them, `@N` = chunk N).
CHUNK_POINTS = (
    "ledger.after_chunk_send",  # chunk N sent; its delivery not recorded
    "ledger.after_chunk",  # chunk N's delivery recorded; chunk N+1 not started
)

# Inside a streamed reply (only streamed turns cross them, so the crash matrix's echo
# turns do not; tests/end_to_end/test_streaming_crashes.py arms them).
STREAM_POINTS = (
    "stream.after_preview",  # preview N shown (`@N`); the agent still writing
    "ledger.after_preview_removed",  # a group's stale preview deleted; its removal not recorded
)


def parse(value: str) -> dict[str, int]:
    """"a,b@3" → {"a": 1, "b": 3}: which hit of each point kills."""
    armed = {}
    for item in value.split(","):
        name, _, nth = item.strip().partition("@")
        if name:
            armed[name] = int(nth) if nth.strip() else 1
    return armed


_kill_at = parse(os.environ.get(ENV, ""))
_armed = frozenset(_kill_at)
_hits: dict[str, int] = {}
_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Die here (SIGKILL, no cleanup: the crash the recovery paths exist for) when armed."""
    if name in _armed:
        _hit(name)


def after_commit(name: str) -> None:
    """The point fires right after the current transaction commits (its work durable,
    nothing after it done yet)."""
    if name in _armed:
        transaction.on_commit(lambda: failpoint(name))


def _hit(name: str) -> None:
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != _kill_at[name]:
            return
    # Written straight to the descriptor: a buffered log line would die with us.
    os.write(2, f"failpoint {name}: killing process {os.getpid()}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
