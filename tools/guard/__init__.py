"""The action guard: an effectful action asked for twice is carried out once.

Claim before, confirm after. A claim row is inserted under a unique constraint
(one live claim per scope, action and semantic fingerprint) *before* the effect runs,
so a crash can never slip between doing and recording. Success confirms the claim and
keeps its result; a failure releases it so a legitimate retry works. A claim still in
flight after its lease was interrupted: it becomes *uncertain* and is never re-run
blindly — the tool reconciles it when it can look itself up, otherwise the model is
told that it may have happened.

A caught duplicate is not an error: the caller gets a success carrying
`duplicate: true`, a note for the model and the original result; it is audited.

The package, by section: `outcomes` (Status, Outcome), `policies`, `helpers`,
`claiming`, `uncertainty`, `proposals` (opened, expired and finished: tools.approvals
decides them), `running`, `guard_only` (the guard alone, for tools an
external agent runs itself), `sweep`. The names below are its interface.
"""

from tools.guard.claiming import (
    Attempt,
    ClaimRequest,
    RateLimited,
    duplicate_outcome,
    note_duplicate,
    rate_limited_outcome,
    take_claim,
)
from tools.guard.guard_only import (
    GUARD_ONLY_NAME,
    ClaimConflict,
    HostedToolName,
    TooManyActions,
    claim_action,
    fail,
    guard_only_name,
    succeed,
)
from tools.guard.helpers import humanize, transition
from tools.guard.outcomes import Outcome, Status
from tools.guard.policies import POLICY_CACHE_SECONDS, ensure_policies, forget_policies, offered_tools, policy_for
from tools.guard.running import (
    ToolDisabled,
    UserConfirmationUnavailable,
    claim_or_settle,
    default_wait,
    execute,
    invoke,
    proposed_outcome,
    settle_existing,
    unconfirmable_channels,
    user_can_confirm,
)
from tools.guard.sweep import sweep
from tools.guard.uncertainty import mark_uncertain, reconcile, release

__all__ = [
    "Attempt",
    "ClaimRequest",
    "ClaimConflict",
    "GUARD_ONLY_NAME",
    "HostedToolName",
    "Outcome",
    "POLICY_CACHE_SECONDS",
    "RateLimited",
    "Status",
    "TooManyActions",
    "ToolDisabled",
    "UserConfirmationUnavailable",
    "unconfirmable_channels",
    "user_can_confirm",
    "claim_action",
    "claim_or_settle",
    "default_wait",
    "duplicate_outcome",
    "ensure_policies",
    "execute",
    "fail",
    "forget_policies",
    "guard_only_name",
    "humanize",
    "invoke",
    "mark_uncertain",
    "note_duplicate",
    "offered_tools",
    "policy_for",
    "proposed_outcome",
    "rate_limited_outcome",
    "reconcile",
    "release",
    "settle_existing",
    "succeed",
    "sweep",
    "take_claim",
    "transition",
]
