"""MCP servers' tools as registry tools: listed into McpTool rows, offered to the agents
of the servers' channels, each call run behind the guard like a hosted tool's.

A listed tool's policy (ToolPolicy, named `<server>__<tool>`) is created with defaults
from its annotations — hints from that server: `readOnlyHint` makes it unguarded only
when the operator marked the server trusted; otherwise every tool is guarded with all
its canonical arguments as the fingerprint; `destructiveHint: true` asks an operator's
approval. Operators change the policy afterwards like any other.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from agentloop.core.redaction import redact
from tools import registry
from tools.mcp.client import AnswerLost, ServerError, ServerSpec, Unreachable, hub
from tools.mcp.models import SEPARATOR, McpServer, McpTool
from tools.models import ApprovalMode

if TYPE_CHECKING:
    import mcp_types

log = logging.getLogger(__name__)

IDEMPOTENCY_META = "io.agentloop/idempotency-key"
# What a listed tool may bring into every turn's request to the model (issue 51): a tool
# over either cap is stored with its reason (McpTool.refused) and never offered.
MAX_SCHEMA_BYTES = 16 * 1024  # its input schema, as compact JSON
MAX_DESCRIPTION_CHARS = 4000
# The per-turn check that a server answers (a listing): short, so a server that is down
# costs a turn this much at most before its tools are left out.
CHECK_SECONDS = 3.0
# A server found down is not asked again by turns for this long (per process).
DOWN_SECONDS = 5.0
_down_until: dict[int, float] = {}  # server pk -> time.monotonic() it may be asked again


def policy_defaults(annotations: dict[str, Any], trusted: bool, call_seconds: float = 30.0) -> dict[str, object]:
    """A new policy's fields from the tool's hints (camelCase, as MCP spells them). Its
    lease outlasts a call's whole deadline, so the sweep never calls a running call lost."""
    defaults: dict[str, object] = {"timeout_seconds": max(60, int(call_seconds) + 15)}
    if trusted and annotations.get("readOnlyHint") is True:
        defaults["guarded"] = False
    elif annotations.get("destructiveHint") is True:
        defaults["approval"] = ApprovalMode.OPERATOR
    return defaults


class RemoteTool(registry.Tool):
    """One MCP server's tool, called through the process's connection to it."""

    def __init__(self, row: McpTool) -> None:
        server = row.server
        self.name = row.offered_as
        self.remote_name = row.name
        self.description = (f"[{server.name}] {row.description}")[:1024]
        self.parameters = row.input_schema or {"type": "object", "properties": {}}
        read_only = server.trusted and row.annotations.get("readOnlyHint") is True
        # Never READ: whether it is guarded is its policy's (an untrusted hint cannot exempt it).
        self.effect = registry.Effect.DELETE if row.annotations.get("destructiveHint") else registry.Effect.CREATE
        self.policy_defaults = policy_defaults(row.annotations, server.trusted, server.timeout_seconds)
        self.read_only = read_only
        self.spec = ServerSpec.of(server)
        self.server_name = server.name
        self.max_result_bytes = server.max_result_bytes

    def run(self, call: registry.ToolCall) -> dict[str, Any]:
        meta = {IDEMPOTENCY_META: call.idempotency_key} if call.idempotency_key else None
        try:
            result = hub.call(self.spec, self.remote_name, call.arguments, meta)
        except (Unreachable, ServerError) as exc:
            raise registry.ToolError(str(exc)) from None
        except AnswerLost as exc:
            raise registry.OutcomeUnknown(str(exc)) from None
        body = self._body(result)
        if result.is_error:
            raise registry.ToolError(f"{self.remote_name} failed: {json.dumps(body, ensure_ascii=False)[:1000]}")
        return body

    def reconcile(self, call: registry.ToolCall) -> dict[str, Any] | None:
        """Look the interrupted action up with the operator's read-only tool."""
        reconcile_with = (McpTool.objects.filter(server_id=self.spec.pk, name=self.remote_name)
                          .values_list("reconcile_with", flat=True).first())  # as it is now, not as cached
        if not reconcile_with:
            raise registry.CannotReconcile(self.name)
        lookup = McpTool.objects.filter(server_id=self.spec.pk, name=reconcile_with).first()
        accepted = set(((lookup.input_schema if lookup else {}) or {}).get("properties", {}))
        arguments = {k: v for k, v in call.arguments.items() if k in accepted}
        try:
            result = hub.call(self.spec, reconcile_with, arguments)
        except (Unreachable, ServerError, AnswerLost) as exc:
            raise registry.CannotReconcile(str(exc)) from None
        body = self._body(result)
        if result.is_error:
            raise registry.CannotReconcile(f"{reconcile_with} failed")
        if not body or body.get("found") is False or ("result" in body and body["result"] in ([], None, "")):
            return None
        return body

    def _body(self, result: mcp_types.CallToolResult) -> dict[str, Any]:
        """The result for the claim and the model: structured content, else the text (JSON
        when it is), redacted with the server's secrets and cut to the server's cap."""
        body: Any  # a server's JSON
        if result.structured_content is not None:
            body = result.structured_content
        else:
            text = "\n".join(getattr(part, "text", f"[{getattr(part, 'type', 'content')}]")
                             for part in result.content)
            try:
                body = json.loads(text)
            except ValueError:
                body = {"text": text}
            if not isinstance(body, dict):
                body = {"result": body}
        encoded = redact(json.dumps(body, ensure_ascii=False, default=str), self.spec.secrets())
        if len(encoded.encode()) > self.max_result_bytes:
            cut = encoded.encode()[: self.max_result_bytes].decode(errors="ignore")
            return {"text": cut, "truncated": True,
                    "note": f"The result was longer than {self.max_result_bytes} bytes and was cut."}
        redacted: dict[str, Any] = json.loads(encoded)  # the dict encoded above
        return redacted


def tool(name: str) -> RemoteTool | None:
    """The registry's fallback: an MCP tool by the name it is offered as."""
    if SEPARATOR not in name:
        return None
    row = (McpTool.objects.select_related("server")
           .filter(offered_as=name, present=True, refused="", server__enabled=True).first())
    return RemoteTool(row) if row is not None else None


def sync(server: McpServer, listed: Iterable[mcp_types.Tool]) -> list[str]:
    """Store what the server listed (mcp Tool models); a policy for each new tool."""
    from tools.guard import policy_for  # the guard imports the registry, which falls back to this module

    now = timezone.now()
    names: list[str] = []
    for item in listed:
        offered_as = f"{server.name}{SEPARATOR}{item.name}"
        if not registry.NAME_PATTERN.match(offered_as):
            log.warning("MCP server %s: tool %r cannot be offered (its name as %r is not a function name)",
                        server.name, item.name[:80], offered_as[:80])
            continue
        annotations = item.annotations.model_dump(by_alias=True, exclude_none=True) if item.annotations else {}
        refused = too_big(item)
        if refused:
            log.warning("MCP server %s: tool %r is not offered: %s", server.name, item.name[:80], refused)
        with transaction.atomic():
            McpTool.objects.update_or_create(server=server, name=item.name, defaults={
                "offered_as": offered_as, "description": (item.description or "")[:MAX_DESCRIPTION_CHARS],
                "input_schema": {} if refused else item.input_schema or {}, "annotations": annotations,
                "present": True, "refused": refused, "listed_at": now})
        if not refused:
            policy_for(offered_as)  # created with the hints' defaults on first sight
        names.append(item.name)
    McpTool.objects.filter(server=server).exclude(name__in=names).update(present=False)
    McpServer.objects.filter(pk=server.pk).update(listed_at=now, last_error="")
    return names


def too_big(item: mcp_types.Tool) -> str:
    """Why a listed tool is too big to offer ("" when it is not)."""
    if len(item.description or "") > MAX_DESCRIPTION_CHARS:
        return f"its description is longer than {MAX_DESCRIPTION_CHARS} characters"
    size = len(json.dumps(item.input_schema or {}, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is larger than {MAX_SCHEMA_BYTES} bytes ({size})"
    return ""


def refresh(server: McpServer, deadline: float | None = None) -> list[str]:
    """List the server's tools now and store them; raises Unreachable (recorded on the row).
    A listing this process stored unchanged within the server's refresh period is not
    written again (each turn checks its servers with a listing)."""
    try:
        listed = hub.list_tools(ServerSpec.of(server), deadline)
    except Unreachable as exc:
        McpServer.objects.filter(pk=server.pk).update(last_error=redact(str(exc), server.secrets())[:2000])
        raise
    digest = hashlib.sha256(json.dumps([item.model_dump(mode="json") for item in listed], sort_keys=True,
                                       default=str).encode()).hexdigest()
    fresh = server.listed_at is not None and \
        (timezone.now() - server.listed_at).total_seconds() < server.refresh_seconds / 2
    if fresh and not server.last_error and _stored.get(server.pk) == (digest, server.updated_at):
        return [item.name for item in listed]
    names = sync(server, listed)
    _stored[server.pk] = (digest, server.updated_at)
    return names


# server pk -> (the digest of the listing this process last stored, the row's updated_at)
_stored: dict[int, tuple[str, datetime]] = {}


def refresh_by_pk(pk: int) -> None:
    """`tools/list_changed` from a server (on a thread of the hub's)."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        server = McpServer.objects.filter(pk=pk, enabled=True).first()
        if server is not None:
            refresh(server)
    except Exception as exc:
        log.info("refreshing MCP server %s after tools/list_changed failed: %s", pk, type(exc).__name__)
    finally:
        close_old_connections()


hub.on_list_changed = refresh_by_pk


def refresh_due(now: datetime | None = None) -> int:
    """The schedule: servers whose listing is older than their refresh_seconds (worker housekeeping)."""
    now = now or timezone.now()
    done = 0
    for server in McpServer.objects.filter(enabled=True):
        if server.listed_at is None or (now - server.listed_at).total_seconds() >= server.refresh_seconds:
            try:
                refresh(server, CHECK_SECONDS)
                done += 1
            except Unreachable:
                pass
    return done


@dataclass
class Offer:
    """What a turn's model is offered from MCP servers, and what it is told about the rest."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI functions
    notes: list[str] = field(default_factory=list)


def offered_to(channel_id: int) -> Offer:
    """The channel's MCP tools whose server answers now (one listing each, bounded), as
    OpenAI functions; a server that does not answer leaves a note instead."""
    from tools.guard import policy_for

    offer = Offer()
    for server in McpServer.objects.filter(enabled=True, channels__pk=channel_id).order_by("name"):
        try:
            if time.monotonic() < _down_until.get(server.pk, 0.0):
                raise LookupError(server.name)  # found down a moment ago: not waited on again in every turn
            try:
                refresh(server, CHECK_SECONDS)
            except Unreachable:
                _down_until[server.pk] = time.monotonic() + DOWN_SECONDS
                raise
        except (Unreachable, LookupError):
            offer.notes.append(f"The tools of {server.name} are unavailable right now (the server does not "
                               "answer); do not promise what needs them, tell the user it cannot be done now.")
            continue
        for row in server.tools.filter(present=True, refused="").select_related("server"):
            if policy_for(row.offered_as).enabled:
                offer.tools.append(RemoteTool(row).as_function())
    return offer


def allowed(tool_: registry.Tool, scope: registry.Scope) -> bool:
    """An MCP tool serves only the conversations of its server's channels."""
    if not isinstance(tool_, RemoteTool):
        return True
    if not scope.conversation_id:
        return False
    channel = McpServer.channels.through.objects.filter(
        mcpserver_id=tool_.spec.pk, channel__slug=scope.channel_slug).exists()
    return channel
