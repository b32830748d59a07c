"""The `recorded` agent of a replay: it plays a recording's answers back instead of asking
a model — the same tool calls (through the guard, which decides them anew) and the same
reply — so a replay with it is deterministic and costs nothing.

A replayed turn plays the recorded turns whose messages it merged, each once: a turn
that merges what were two turns makes both turns' calls and says both replies; when a
recorded turn's messages are split over several replayed turns, the first of them plays
it and the others have nothing left to say (no reply)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from conversations.agents import Agent, TurnContext

NAME = "recorded"


@dataclass
class RecordedAnswer:
    """What a replayed turn plays back: the recorded turns' tool calls, replies, tokens and latency."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    tokens: int = 0
    latency_ms: int = 0


class Answers:
    """One replay's recorded answers, each handed out once."""

    def __init__(self, recorded_turns: Iterable[dict[str, Any]]) -> None:
        self.turns = list(recorded_turns)
        self.played: set[int] = set()

    def for_messages(self, message_ids: Iterable[str]) -> RecordedAnswer:
        wanted = set(message_ids)
        answer = RecordedAnswer()
        for index, turn in enumerate(self.turns):
            if index in self.played or not wanted & set(turn.get("messages") or ()):
                continue
            self.played.add(index)
            answer.calls += [call for call in turn.get("tools") or () if call.get("tool")]
            answer.replies += [turn["reply"]] if turn.get("reply") else []
            answer.tokens += int(turn.get("tokens") or 0)
            answer.latency_ms = max(answer.latency_ms, int(turn.get("latency_ms") or 0))
        return answer


class RecordedAgent(Agent):
    def __init__(self, answer: RecordedAnswer) -> None:
        self.answer = answer

    async def respond(self, ctx: TurnContext) -> str:
        assert ctx.call_tool is not None, "a replayed turn's context has call_tool"
        for call in self.answer.calls:
            await ctx.call_tool(call["tool"], dict(call.get("arguments") or {}))
        if ctx.record_usage is not None and self.answer.tokens:
            await ctx.record_usage(self.answer.tokens)
        return "\n".join(self.answer.replies)
