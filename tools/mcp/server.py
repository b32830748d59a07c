"""agentloop as an MCP server: `/mcp` (streamable HTTP, stateless, JSON answers), for
agent keys, as the REST API is.

- The hosted tools, each call through `guard.invoke` exactly as
  `POST /api/v1/tools/<name>/invoke`: a duplicate is a successful result carrying
  `duplicate: true`, the note and the original result.
- The guard alone, for the agent's own actions: `guard_claim`, `guard_succeed`,
  `guard_fail` — the semantics of `/api/v1/actions/claim|succeed|fail`.

Whose action a hosted tool's call is: the conversation named in the request's `_meta`
(`io.agentloop/conversation`, one of the key's channels'), else the scope it names
(`io.agentloop/scope`), else the key's own scope `mcp`. `/mcp/<channel>` serves a key
only if it holds that channel.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, TypeVarTuple

import anyio
import mcp_types as types
from django.db import close_old_connections
from mcp.server.lowlevel.server import Server

from agentloop.core.redaction import redact, redact_payload
from tools import guard, registry
from tools.conversation_side import conversation_side
from tools.models import ActionClaim
from tools.registry import Effect, Scope, Tool

if TYPE_CHECKING:
    from mcp.server import ServerRequestContext

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

log = logging.getLogger(__name__)

KEY_IN_SCOPE = "agentloop.agent_key"
CHANNEL_IN_SCOPE = "agentloop.channel"
CONVERSATION_META = "io.agentloop/conversation"
SCOPE_META = "io.agentloop/scope"

_SCOPED = {
    "conversation": {"type": "integer", "minimum": 1, "description": "A conversation id (its contact is the scope)."},
    "scope": {"type": "string", "maxLength": 150, "description": "Or an explicit scope of your own (a customer id)."},
}
GUARD_TOOLS = [
    types.Tool(
        name="guard_claim",
        description="Claim an action you will run yourself, before running it. status 'proceed': run it, then call "
                    "guard_succeed (or guard_fail) with the claim. duplicate true: do NOT run it; the note says what "
                    "to tell the user and `original` carries the stored result. Give conversation or scope.",
        input_schema={"type": "object", "required": ["action", "arguments"], "additionalProperties": False,
                      "properties": {
                          "action": {"type": "string", "pattern": guard.GUARD_ONLY_NAME.pattern},
                          "arguments": {"type": "object"},
                          "fingerprint": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                                          "description": "Argument names that make two calls the same action."},
                          **_SCOPED}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                          open_world_hint=False)),
    types.Tool(
        name="guard_succeed",
        description="The claimed action succeeded: keep its result (identical claims get it back).",
        input_schema={"type": "object", "required": ["claim"], "additionalProperties": False,
                      "properties": {"claim": {"type": "integer", "minimum": 1}, "result": {}}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                          open_world_hint=False)),
    types.Tool(
        name="guard_fail",
        description="The claimed action failed and did not happen: the claim is released, a retry may run.",
        input_schema={"type": "object", "required": ["claim", "error"], "additionalProperties": False,
                      "properties": {"claim": {"type": "integer", "minimum": 1},
                                     "error": {"type": "string", "maxLength": 2000}}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=False)),
]


class AgentKey(Protocol):
    """conversations.models.AgentKey, as the server reads it (the request's key, in the ASGI scope)."""

    @property
    def pk(self) -> Any: ...  # Django's pk is untyped (Model.pk)

    @property
    def name(self) -> str: ...


def annotations_of(tool: Tool) -> types.ToolAnnotations:
    """What a hosted tool does, said as MCP's hints: reads are read-only; effects are
    idempotent here because the guard answers a repeat with the first result."""
    if tool.effect == Effect.READ:
        return types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    return types.ToolAnnotations(read_only_hint=False, destructive_hint=tool.effect == Effect.DELETE,
                                 idempotent_hint=tool.guarded, open_world_hint=tool.effect == Effect.SEND)


class Refused(Exception):
    """The call is refused before anything is claimed (an error result)."""


# --- the calls, on a thread (the ORM) ------------------------------------------------------------


def _hosted_tools() -> list[types.Tool]:
    listed = []
    for name, tool in registry.all_tools().items():
        if guard.policy_for(name).enabled:
            listed.append(types.Tool(name=name, description=tool.description, input_schema=tool.parameters,
                                     annotations=annotations_of(tool)))
    return listed


def _scope(key: AgentKey, meta: dict[str, Any], data: dict[str, Any], channel: str | None) -> Scope:
    conversation = data.get("conversation", meta.get(CONVERSATION_META))
    if conversation is not None:
        try:
            found = conversation_side().conversation_for_key(key, conversation)
        except Exception:  # the API's NotFound: not among the key's channels
            raise Refused(f"no conversation {conversation} among this key's channels") from None
        if channel is not None and found.channel.slug != channel:
            raise Refused(f"no conversation {conversation} in channel {channel}")
        return Scope.of_conversation(found)
    name = data.get("scope", meta.get(SCOPE_META)) or "mcp"
    if not isinstance(name, str) or not 0 < len(name) <= 150:
        raise Refused("scope must be a string of 1-150 characters")
    return Scope.of_agent(key.pk, name)


def _call(key: AgentKey, channel: str | None, name: str, arguments: dict[str, Any],
          meta: dict[str, Any]) -> dict[str, Any]:
    actor = f"agent:{key.name}"[:100]
    if name == "guard_claim":
        scoped: dict[str, Any] = {k: arguments[k] for k in ("conversation", "scope") if k in arguments}
        if len(scoped) != 1:
            raise Refused("give exactly one of 'conversation' or 'scope'")
        outcome, created = guard.claim_action(arguments.get("action", ""), arguments.get("arguments"),
                                              _scope(key, {}, scoped, channel), fields=arguments.get("fingerprint"),
                                              actor=actor, agent_key_id=key.pk)
        if created:
            # Created: the claim was just taken, its id is set.
            claim = ActionClaim.objects.get(pk=outcome.claim_id)  # type: ignore[misc]
            return {"status": "proceed", "claim": claim.pk, "duplicate": False, "fingerprint": claim.fingerprint,
                    "expires_at": claim.expires_at.isoformat()}
        return {**outcome.for_model(), "claim": outcome.claim_id}
    if name in ("guard_succeed", "guard_fail"):
        settle = guard.succeed if name == "guard_succeed" else guard.fail
        value = arguments.get("result") if name == "guard_succeed" else arguments.get("error", "")
        try:
            claim = settle(int(arguments.get("claim", 0)), value, agent_key_id=key.pk)
        except ActionClaim.DoesNotExist:
            raise Refused(f"no claim {arguments.get('claim')}") from None
        return {"claim": claim.pk, "state": claim.state, "result": claim.result}
    tool = registry.all_tools().get(name)
    if tool is None:
        raise Refused(f"unknown tool {name!r}")
    outcome = guard.invoke(name, arguments, _scope(key, meta, {}, channel), actor=actor, agent_key_id=key.pk)
    return {**outcome.for_model(), "claim": outcome.claim_id}


def _run(function: Callable[[*Ts], T], *args: *Ts) -> T:
    close_old_connections()
    try:
        return function(*args)
    finally:
        close_old_connections()


def _as_result(body: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    body = redact_payload(body)
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False,
                                                                                      default=str))],
                                structured_content=body, is_error=is_error)


# --- the protocol's handlers ---------------------------------------------------------------------


def _caller(ctx: ServerRequestContext) -> tuple[AgentKey | None, str | None]:
    scope = ctx.request.scope if ctx.request is not None else {}
    return scope.get(KEY_IN_SCOPE), scope.get(CHANNEL_IN_SCOPE)


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[*await anyio.to_thread.run_sync(_run, _hosted_tools), *GUARD_TOOLS])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    key, channel = _caller(ctx)
    if key is None:  # the mount lets no request through without one
        return _as_result({"error": "no agent key"}, is_error=True)
    given: Any = params.meta  # a dict (a TypedDict) in this SDK, a pydantic model in earlier ones
    meta = (given.model_dump(by_alias=True) if hasattr(given, "model_dump") else dict(given or {}))
    try:
        body = await anyio.to_thread.run_sync(_run, _call, key, channel, params.name, params.arguments or {}, meta)
    except (Refused, registry.InvalidArguments, registry.UnknownTool, guard.ToolDisabled, guard.ClaimConflict,
            guard.HostedToolName, guard.TooManyActions) as exc:
        return _as_result({"status": "failed", "duplicate": False, "error": redact(str(exc))}, is_error=True)
    return _as_result(body, is_error=body.get("status") == guard.Status.FAILED)


def build() -> Server:
    return Server("agentloop", version="1", on_list_tools=list_tools, on_call_tool=call_tool,
                  instructions="Tools behind agentloop's action guard: an action asked twice is carried out once; a "
                               "result with duplicate: true was not run again — tell the user it is already done.")
