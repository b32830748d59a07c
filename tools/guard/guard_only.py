"""The guard alone, for tools an external agent runs itself: claim, then `succeed` or
`fail`, in its agent key's own namespace of action names."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from tools import registry
from tools.fingerprint import compute
from tools.guard.claiming import ClaimRequest
from tools.guard.helpers import transition
from tools.guard.outcomes import Outcome
from tools.guard.policies import _policies, policy_for
from tools.guard.running import claim_or_settle
from tools.models import ActionClaim, ClaimState, ToolPolicy
from tools.registry import Scope


def claim_action(action: str, arguments: object, scope: Scope, *, fields: object = None, actor: str,
                 agent_key_id: int | None = None, wait: float | None = None) -> tuple[Outcome, bool]:
    """Guard-only: (Outcome, created). Created means: proceed, run it, then call
    `succeed` or `fail` with the claim id."""
    action = guard_only_name(action, agent_key_id)
    if not isinstance(arguments, dict):
        raise registry.InvalidArguments("arguments must be a JSON object")
    policy = policy_for(action)
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise registry.InvalidArguments("fingerprint must be a list of argument names")
    # No tool of ours behind the name (guard_only_name refuses hosted tools' names): no
    # declared fields, no normalizers.
    named: list[str] = fields or policy.fingerprint_fields or []
    fp = compute(action, named, arguments, {}, scope)
    attempt, outcome = claim_or_settle(ClaimRequest(action, arguments, scope, fp, policy), actor=actor,
                                       agent_key_id=agent_key_id, wait=wait)
    if outcome is not None:
        return outcome, False
    assert attempt is not None  # claim_or_settle gives one or the other
    return Outcome("proceed", claim_id=attempt.claim.pk), True


class ClaimConflict(Exception):
    pass


# Guard-only actions live in their agent key's namespace: stored as "ext:<key id>:<name>",
# so no key takes a hosted tool's name (nor another key's), and each key has a bounded
# number of them (each is a policy row operators see). 48 characters leave room for the
# prefix in the 64-character name columns.
GUARD_ONLY_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,48}$")


class HostedToolName(Exception):
    pass


class TooManyActions(Exception):
    pass


def guard_only_name(action: str, agent_key_id: int | None) -> str:
    """The stored name of an agent key's own action; raises when it may not have it."""
    if not GUARD_ONLY_NAME.match(action or ""):
        raise registry.InvalidArguments("action must be 1-48 letters, digits, '_' or '-'")
    if action in registry.all_tools():
        raise HostedToolName(f"'{action}' is a hosted tool: run it with POST /api/v1/tools/{action}/invoke; "
                             "actions you run yourself need names of their own")
    prefix = f"ext:{agent_key_id or 0}:"
    name = prefix + action
    limit: int = settings.AGENTLOOP_MAX_ACTIONS_PER_KEY
    if (_policies.get(name) is None and not ToolPolicy.objects.filter(name=name).exists()
            and ToolPolicy.objects.filter(name__startswith=prefix).count() >= limit):
        raise TooManyActions(f"this agent key already uses {limit} action names (AGENTLOOP_MAX_ACTIONS_PER_KEY); "
                             "reuse one of them, or ask an operator to delete the policies of unused ones")
    return name


def succeed(claim_id: int, result: Any, *, agent_key_id: int | None = None) -> ActionClaim:
    claim = _own_claim(claim_id, agent_key_id)
    if claim.state == ClaimState.DONE:
        return claim  # a retried confirmation changes nothing
    if not transition(claim.pk, [ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN], ClaimState.DONE, result=result):
        claim.refresh_from_db()
        if claim.state != ClaimState.DONE:
            raise ClaimConflict(f"claim {claim.pk} is {claim.state}: it can no longer succeed")
    claim.refresh_from_db()
    return claim


def fail(claim_id: int, error: object, *, agent_key_id: int | None = None) -> ActionClaim:
    claim = _own_claim(claim_id, agent_key_id)
    if claim.state == ClaimState.RELEASED:
        return claim
    if not transition(claim.pk, [ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN], ClaimState.RELEASED,
                       error=str(error)[:2000]):
        claim.refresh_from_db()
        if claim.state != ClaimState.RELEASED:
            raise ClaimConflict(f"claim {claim.pk} is {claim.state}: it can no longer fail")
    claim.refresh_from_db()
    return claim


def _own_claim(claim_id: int, agent_key_id: int | None) -> ActionClaim:
    claim = ActionClaim.objects.filter(pk=claim_id).first()
    if claim is None or (agent_key_id is not None and claim.agent_key_id != agent_key_id):
        raise ActionClaim.DoesNotExist(f"no claim {claim_id}")
    return claim
