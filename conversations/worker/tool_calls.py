"""Tool calls from inside turns, through the action guard, on threads of their own
(tools block: SMTP, CalDAV, waiting on an identical call in flight)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentloop.core import tracing
from agentloop.core.backoff import DATABASE_FAULTS
from agentloop.core.redaction import redact
from conversations import turns
from conversations.agents import TurnCancelled
from conversations.worker.dbthread import DatabaseThread
from tools import guard, registry
from tools.mcp import catalog
from tools.registry import Scope

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Conversation, Turn
    from conversations.worker.supervisor import Worker
    from tools.guard import Outcome


def _invoke_for_conversation(name: str, arguments: dict[str, Any], conversation: Conversation, actor: str) -> Outcome:
    return guard.invoke(name, arguments, Scope.of_conversation(conversation), actor=actor)


def _allowed_here(tool: registry.Tool, conversation: Conversation) -> bool:
    return catalog.allowed(tool, Scope.of_conversation(conversation))


class OfferedTools(list[dict[str, Any]]):
    """Function definitions, and notes for the model about tools left out this turn."""

    notes: list[str] = []


class ToolCalls:
    def __init__(self, worker: Worker, threads: int) -> None:
        self.worker = worker
        self.threads = DatabaseThread("tool", threads)
        self._offered: tuple[float, list[dict[str, Any]]] = (0.0, [])  # (expires, OpenAI functions)

    async def offered(self) -> list[dict[str, Any]]:
        """The tools offered to models, refreshed from the policies every few seconds
        (not a database round trip in every turn)."""
        expires, tools = self._offered
        if time.monotonic() >= expires:
            try:
                tools = await self.worker.db(guard.offered_tools)
            except DATABASE_FAULTS:
                if not expires:
                    raise
                return tools  # the database is away: the last list still holds
            self._offered = (time.monotonic() + guard.POLICY_CACHE_SECONDS, tools)
        return tools

    async def offered_for(self, conversation: Conversation) -> OfferedTools:
        """The hosted tools, and the MCP tools of the conversation's channel whose server
        answers now (checked on a tool thread, bounded): a list, with `notes` for the model
        about servers that do not answer."""
        tools = OfferedTools(await self.offered())
        offer = await self.threads(catalog.offered_to, conversation.channel_id)
        tools += offer.tools
        tools.notes = offer.notes
        return tools

    async def call(self, turn: Turn, conversation: Conversation, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A tool call from inside a turn, through the action guard; the result is what
        the model gets back (a refusal or failure is a result too, never an exception)."""
        try:
            tool: registry.Tool | None = registry.all_tools().get(name)
            if not tool:  # (not `or`: mypy would type the database's answer as the left side's)
                tool = await self.worker.db(registry.get, name)
            if isinstance(tool, catalog.RemoteTool) and \
                    not await self.worker.db(_allowed_here, tool, conversation):
                raise registry.UnknownTool(f"unknown tool {name!r}")
        except registry.UnknownTool as exc:
            return {"status": "failed", "duplicate": False, "error": redact(str(exc))}
        # Through a database fault (a failover: seconds) rather than failing the turn: the mark
        # is idempotent, and the agent's own deadline bounds the wait.
        if tool.guarded and not await self.worker.db.persist(turns.mark_effect, turn.pk):
            raise TurnCancelled()
        try:
            # On a tool thread, under the agent call's span (traced: the guard's span is its child).
            # Through a database fault (a failover), tried again rather than failing the turn:
            # the guard's claim is what makes that safe — a claim already taken holds the call
            # as in progress, so the effect never runs twice.
            outcome: Outcome = await self.threads.persist(tracing.carry(_invoke_for_conversation), name, arguments,
                                                          conversation, f"worker:{self.worker.owner}")
        except (registry.InvalidArguments, guard.ToolDisabled) as exc:
            return {"status": "failed", "duplicate": False, "error": redact(str(exc))}
        return outcome.for_model()

    def close(self) -> None:
        self.threads.close()
