"""Policies: the operator's settings of each action, cached briefly per process."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from agentloop.core.caches import BoundedCache
from tools import registry
from tools.models import ToolPolicy

POLICY_CACHE_SECONDS = 2.0
# Bounded: hosted tools plus each agent key's guard-only actions (AGENTLOOP_MAX_ACTIONS_PER_KEY).
_policies: BoundedCache[str, ToolPolicy] = BoundedCache(maxsize=1024, max_age=POLICY_CACHE_SECONDS)


def policy_for(name: str) -> ToolPolicy:
    """The operator's policy for an action, created with defaults on first use; cached
    briefly per process (edits in the admin apply within two seconds)."""
    cached = _policies.get(name)
    if cached is not None:
        return cached
    policy = ToolPolicy.objects.filter(name=name).first()
    if policy is None:
        try:
            with transaction.atomic():
                policy = ToolPolicy.objects.create(name=name, **_policy_defaults(name))
        except IntegrityError:
            policy = ToolPolicy.objects.get(name=name)
    return _policies.set(name, policy)


def _policy_defaults(name: str) -> dict[str, Any]:
    try:
        return dict(registry.get(name).policy_defaults)
    except registry.UnknownTool:
        return {}  # an external agent's own action


def forget_policies() -> None:
    _policies.clear()
    registry.forget_sources()  # MCP servers' tools, cached as long


def offered_tools() -> list[dict[str, Any]]:
    """The enabled tools as OpenAI function definitions (what a model is offered)."""
    return [tool.as_function() for name, tool in registry.all_tools().items() if policy_for(name).enabled]


def ensure_policies() -> None:
    """One policy row per registered tool, so operators find them all in the admin."""
    for name in registry.all_tools():
        policy_for(name)
