"""One replayed turn, run inline: started, its agent asked, its end written down with its
reply — the worker's steps (conversations.worker.turn_runner, tool_calls), on the
replay's own thread and connection, inside its transaction, at its virtual time.

The agent is asynchronous and the database work is not: the agent runs on an event loop
of its own (async_to_sync) and every database call it makes through its context comes
back to this thread (sync_to_async, thread-sensitive), so the replay's transaction sees
— and rolls back — all of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

from conversations import agent_sessions, engine, languages, limits, turns
from conversations.agents import Agent, AgentUnavailable, TurnCancelled, TurnContext, answer_of
from conversations.models import Conversation, Turn, TurnState
from conversations.worker.turn_runner import APOLOGY, deadline_for
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tools import guard, registry
from tools.guard.running import guard_outcome

OWNER = "replay"  # the owner stamped on a replay's turns and ledger claims
T = TypeVar("T")


@dataclass
class Ran:
    """A turn's run, its end not yet written: it is, at `ends_at` in virtual time."""

    turn: Turn
    state: TurnState
    reply: str
    outcome: str
    ends_at: datetime
    calls: list[dict[str, Any]] = field(default_factory=list)


def _in_this_thread(fn: Callable[..., T]) -> Callable[..., Any]:
    return sync_to_async(fn, thread_sensitive=True)


async def _db(fn: Callable[..., T], *args: Any) -> T:
    """The ledger's database runner: on the replay's thread, in its transaction."""
    answered: T = await _in_this_thread(fn)(*args)
    return answered


class TurnStep:
    """The turns of one replay: `tools` (None: every tool) limits what its agent may call."""

    def __init__(self, tools: list[str] | None) -> None:
        self.tools = tools

    def run(self, turn: Turn, agent: Agent, config: dict[str, Any], now: datetime,
            latency: timedelta | None = None) -> Ran | None:
        """Start `turn` at `now` and run its agent (None: another turn of its conversation
        runs). Its end is at `now` plus the recorded `latency`, else the agent's own."""
        if not turns.start(turn.pk, OWNER, now):
            return None
        turn.refresh_from_db()
        calls: list[dict[str, Any]] = []
        context = self.context(turn, config, now, calls)
        began = time.monotonic()
        state, reply, outcome = TurnState.DONE, "", ""
        try:
            reply = answer_of(async_to_sync(self.answer)(agent, context, deadline_for(config))).text
        except TurnCancelled as exc:
            state, outcome = TurnState.CANCELLED, str(exc) or "cancelled"
        except (AgentUnavailable, TimeoutError) as exc:
            state, reply, outcome = TurnState.FAILED, str(APOLOGY), f"agent unavailable: {exc}"
        except Exception as exc:  # an agent's failure is the turn's, as in a worker
            state, reply, outcome = TurnState.FAILED, str(APOLOGY), f"{type(exc).__name__}: {exc}"
        took = latency if latency is not None else timedelta(seconds=time.monotonic() - began)
        return Ran(turn, state, reply, outcome, now + took, calls)

    @staticmethod
    async def answer(agent: Agent, context: TurnContext, deadline: float) -> Any:
        return await asyncio.wait_for(agent.respond(context), deadline)

    def context(self, turn: Turn, config: dict[str, Any], now: datetime, calls: list[dict[str, Any]]) -> TurnContext:
        conversation = turn.conversation
        return TurnContext(
            turn_id=turn.pk, conversation_id=conversation.pk, channel_slug=conversation.channel.slug,
            text=turn.merged_input, config=config, channel_kind=conversation.channel.kind,
            contact_name=conversation.sender_id, language=languages.of(conversation),
            load_history=lambda: _in_this_thread(engine.conversation_history)(conversation, turn),
            mark_effect=lambda: _in_this_thread(turns.mark_effect)(turn.pk, now),
            call_tool=lambda name, arguments: _in_this_thread(self.call_tool)(turn, now, name, arguments, calls),
            load_tools=lambda: _in_this_thread(self.offered)(),
            record_usage=lambda tokens: _in_this_thread(limits.add_tokens)(turn.pk, tokens),
            load_session=lambda key: _in_this_thread(agent_sessions.load)(conversation.pk, key),
            save_session=lambda key, state, *, new: _in_this_thread(agent_sessions.save)(conversation.pk, key, state,
                                                                                        new=new))

    def offered(self) -> list[dict[str, Any]]:
        """The hosted tools offered to a model (a replay offers no MCP server's: it would call out to list them)."""
        return [f for f in guard.offered_tools() if self.tools is None or f["function"]["name"] in self.tools]

    def call_tool(self, turn: Turn, now: datetime, name: str, arguments: dict[str, Any],
                  calls: list[dict[str, Any]]) -> dict[str, Any]:
        """A tool call through the real guard (tools.sandbox keeps its effect from running);
        the guarded ones noted in `calls`, as a recording notes them."""
        if self.tools is not None and name not in self.tools:
            return {"status": "failed", "duplicate": False, "error": f"tool {name!r} is not offered in this replay"}
        try:
            tool = registry.get(name)
            if tool.guarded and not turns.mark_effect(turn.pk, now):
                raise TurnCancelled("cancelled before its effect")
            outcome = guard.invoke(name, arguments, registry.Scope.of_conversation(turn.conversation), actor=OWNER)
        except (registry.UnknownTool, registry.InvalidArguments, guard.ToolDisabled) as exc:
            return {"status": "failed", "duplicate": False, "error": str(exc)}
        if outcome.claim_id is not None or outcome.duplicate:
            calls.append({"tool": name, "arguments": arguments, "guard": guard_outcome(outcome)})
        return outcome.for_model()

    @staticmethod
    def finish(ran: Ran) -> bool:
        """The turn's end written down at `ran.ends_at`, its reply into the ledger, in one
        transaction (False: it was cancelled meanwhile, and says nothing)."""
        turn = ran.turn
        with transaction.atomic():
            if ran.state == TurnState.CANCELLED:  # the agent found it cancelled (or gave up): no reply
                turns.cancel(turn.pk, ran.outcome, ran.ends_at)
                return False
            if not turns.finish(turn.pk, OWNER, state=ran.state, reply_text=ran.reply, outcome=ran.outcome,
                                now=ran.ends_at):
                return False
            if ran.reply:
                kind = OutboundKind.REPLY if ran.state == TurnState.DONE else OutboundKind.NOTICE
                ledger.enqueue(turn.conversation, ran.reply, kind=kind, turn=turn, reply_target=turn.reply_target,
                               thread_id=turn.thread_id)
        return True


def deliver(conversation: Conversation, now: datetime) -> int:
    """Every pending ledger row of the conversation claimed and sent (the sandbox's
    transport records it), its outcome recorded: the ledger's own steps."""
    pending = list(OutboundMessage.objects.filter(conversation=conversation, state=OutboundState.PENDING)
                   .values_list("pk", flat=True))
    sent = 0
    for row in ledger.claim_many(pending, OWNER, now) if pending else []:
        result = async_to_sync(ledger.send)(row, _db)
        ledger.finish(row, OWNER, result, now)
        sent += 1
    return sent
