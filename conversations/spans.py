"""The worker's spans of a message's path (agentloop.core.tracing): the flush that merges
a buffer into a turn, the turn's run and its agent's call. Ids and counts only.

The flush span continues the trace of the burst's first message (the child of its
admission span, read from the stored message) and links to every message's admission;
the turn stores the flush span's traceparent, under which the run's span starts in
whichever worker runs it, however many times."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from agentloop.core import tracing

if TYPE_CHECKING:
    from agentloop.core.tracing import NoSpan
    from agentloop.core.tracing_export import Span
    from conversations.models import InboundMessage, Turn

    Started = list[Span | NoSpan]  # the flush spans of a batch, one a turn

FLUSH = "agentloop.flush"
TURN = "agentloop.turn"
AGENT = "agentloop.agent"


def flushes(new_turns: Sequence[Turn], by_buffer: Mapping[int | None, Sequence[InboundMessage]]) -> Started:
    """A flush span for each turn about to be created, its traceparent set on the turn;
    [] while tracing is off."""
    if not tracing.on():
        return []
    started: Started = []
    for turn in new_turns:
        messages = by_buffer.get(turn.buffer_id, ())
        parents = [m.traceparent for m in messages]
        span = tracing.span(FLUSH, parents[0] if parents else None, links=parents, attributes={
            "agentloop.buffer.id": turn.buffer_id, "agentloop.conversation.id": turn.conversation.pk,
            "agentloop.channel.kind": turn.conversation.channel.kind, "agentloop.flush.reason": turn.flush_reason,
            "agentloop.turn.messages": len(messages)})
        turn.traceparent = span.traceparent
        started.append(span)
    return started


def flushed(started: Started, created: Sequence[Turn]) -> None:
    """The turns are written: their spans end when the flush commits (a rolled-back flush,
    which made no turn, exports none)."""
    for span, turn in zip(started, created):
        span.set({"agentloop.turn.id": turn.pk, "agentloop.turn.born_running": turn.state == "running"})
    if started:
        transaction.on_commit(lambda: [span.end() for span in started])


def turn(turn: Turn, agent_name: str) -> Span | NoSpan:
    """The span of one run of a turn (a context manager), under its flush's."""
    if not tracing.on():
        return tracing.NO_SPAN
    conversation = turn.conversation
    return tracing.span(TURN, turn.traceparent, attributes={
        "agentloop.turn.id": turn.pk, "agentloop.conversation.id": conversation.pk,
        "agentloop.channel.kind": conversation.channel.kind, "agentloop.agent": agent_name,
        "agentloop.turn.attempt": turn.attempts})


def agent_call(agent_name: str, config: Mapping[str, Any] | None, streamed: bool) -> Span | NoSpan:
    """The span of the agent's call inside the current turn's: which agent and model,
    never what was said."""
    if not tracing.on():
        return tracing.NO_SPAN
    model = (config or {}).get("model")
    return tracing.span(AGENT, kind="client", attributes={
        "agentloop.agent": agent_name, "gen_ai.operation.name": "chat",
        "gen_ai.request.model": str(model)[:100] if model else None, "agentloop.agent.streamed": streamed})
