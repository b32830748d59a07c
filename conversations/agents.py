"""Agents: what runs inside a turn, registered by name in settings.AGENTLOOP_AGENTS
(echo, demo, openai, webhook, pull, a2a).

An agent gets the merged input (and can load the conversation's history). It acts on
the world through `ctx.call_tool(name, arguments)`: the registry's tools behind the
action guard (an identical action asked for twice is carried out once; the result then
says `duplicate: true` with a note for the model). `call_tool` marks the turn as having
fired an effect before any effectful tool runs, and raises TurnCancelled if the turn was
cancelled meanwhile. An agent acting on the world by other means must call
`ctx.mark_effect()` first: it returns False when the turn was cancelled, and then the
agent must not act.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.module_loading import import_string
from django.utils.translation import gettext

# A JSON object as agents, models and tools exchange them: its shape is theirs.
JsonObject = dict[str, Any]


class TurnCancelled(Exception):
    """The turn was cancelled before it could fire its effect."""


class HandedOver(Exception):
    """The turn now belongs to an external agent, which replies through the API."""


class AgentUnavailable(Exception):
    """The agent's provider failed or timed out: the turn ends with an apology and is
    never re-run (it may have acted already)."""


@dataclass
class TurnContext:
    turn_id: int
    conversation_id: int
    channel_slug: str
    text: str
    config: JsonObject = field(default_factory=dict)
    mark_effect: Callable[[], Awaitable[bool]] | None = None
    # Chat messages ({"role", "content"}) of finished turns and notes since /reset;
    # loaded only when asked for.
    load_history: Callable[[], Awaitable[list[JsonObject]]] | None = None
    # (tool name, arguments) -> the result for the model (see tools.guard.Outcome.for_model).
    call_tool: Callable[[str, JsonObject], Awaitable[JsonObject]] | None = None
    # The tools offered to the model: OpenAI function definitions of the enabled tools.
    load_tools: Callable[[], Awaitable[list[JsonObject]]] | None = None
    # Where the turn came from, for agents that speak to other services.
    channel_kind: str = ""
    contact_name: str = ""
    language: str = ""  # the user's (conversations.languages): what our own texts are written in
    # The files of the burst (conversations.media.for_agents.Attachment, a layer above:
    # named in words only), settled: stored, or skipped or failed with the reason.
    # `for_agents.parts` makes model content of them.
    media: list[Any] = field(default_factory=list)
    # Report the tokens a model request used (the provider's `usage`): the turn records
    # them for the contact's daily budget (conversations.limits).
    record_usage: Callable[[int], Awaitable[None]] | None = None
    # What a remote agent keeps for this conversation between turns, under a key of its
    # choosing (conversations.agent_sessions): `load_session(key)` -> its state ({} after
    # a /reset), `save_session(key, state, new=…)`.
    load_session: Callable[[str], Awaitable[JsonObject]] | None = None
    save_session: Callable[..., Awaitable[None]] | None = None


@dataclass(frozen=True)
class File:
    """A file an agent answers with (an image, a document such as a booking's .ics). Its
    type is read from its bytes when it is stored, never taken from its name."""

    name: str
    data: bytes | None  # None: an agent's file whose bytes could not be read (refused when stored)
    caption: str = ""


@dataclass(frozen=True)
class Answer:
    """A reply with files: the text goes first, then each file (through the ledger, each
    a chunk of the reply's row: delivery.attachments)."""

    text: str
    files: tuple[File, ...] = ()


def answer_of(reply: object) -> Answer:
    """What an agent returned (a str, or an Answer) as an Answer."""
    if isinstance(reply, Answer):
        return reply
    return Answer(str(reply) if reply is not None else "")


async def _may_act(ctx: TurnContext) -> bool:
    """ctx.mark_effect(): the worker sets it on every turn it runs."""
    assert ctx.mark_effect is not None, "a turn's context without mark_effect"
    return await ctx.mark_effect()


class Agent(abc.ABC):
    def streams_for(self, config: JsonObject) -> bool:
        """Whether `stream` yields text as the agent writes it with this configuration
        (False: one Answer at the end, the default `stream` over `respond`): only then
        does a turn set up previews."""
        return False

    @abc.abstractmethod
    async def respond(self, ctx: TurnContext) -> str | Answer:
        """The reply for this turn: its text, or an Answer carrying files too."""

    async def stream(self, ctx: TurnContext) -> AsyncIterator[str | Answer]:
        """The streaming form: text deltas (str) as the agent writes them, then the
        Answer, last (its text is the whole reply; it is what the ledger sends). The
        deltas are best effort, shown as previews (conversations.worker.streams); an agent
        that cannot stream answers once, here."""
        yield answer_of(await self.respond(ctx))

    async def prepare(self, config: JsonObject) -> None:
        """Called once per channel using this agent when a worker starts, so the first
        turn does not pay for setting up clients."""


class EchoAgent(Agent):
    """Replies with the merged text. `config`: `delay` (seconds, simulates a model's
    latency) and `mark_effect` (declare an external effect before answering) make it
    useful for demonstrating double texting and for benchmarks. Streamed (the
    playground, tests: `stream_pace` set), it writes the text a word every `stream_pace`
    seconds; `effect_at_word` declares the effect after that many words, mid-stream."""

    def streams_for(self, config: JsonObject) -> bool:
        return "stream_pace" in config  # the benchmarks' and tests' echo answers at once

    async def respond(self, ctx: TurnContext) -> str:
        if ctx.config.get("mark_effect") and not await _may_act(ctx):
            raise TurnCancelled()
        delay = float(ctx.config.get("delay", 0) or 0)
        if delay:
            await asyncio.sleep(delay)
        return ctx.text

    async def stream(self, ctx: TurnContext) -> AsyncIterator[str | Answer]:
        config = ctx.config
        if config.get("mark_effect") and not await _may_act(ctx):
            raise TurnCancelled()
        await asyncio.sleep(float(config.get("delay", 0) or 0))
        pace = float(config.get("stream_pace", 0.1) or 0)
        effect_at = int(config.get("effect_at_word", 0) or 0)
        for index, word in enumerate(re.findall(r"\S+\s*", ctx.text)):
            if index and pace:
                await asyncio.sleep(pace)
            if effect_at and index == effect_at and not await _may_act(ctx):
                raise TurnCancelled()
            yield word
        yield Answer(ctx.text)


def agent_for(name: str) -> Agent:
    path = settings.AGENTLOOP_AGENTS.get(name)
    if path is None:
        raise LookupError(f"unknown agent {name!r}; known: {', '.join(sorted(settings.AGENTLOOP_AGENTS))}")
    agent: Agent = import_string(path)()
    return agent


# --- which environment variable may hold an agent's key ---------------------------------

KEY_ENV_PATTERN = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")


def key_env_problem(name: object) -> str:
    """Why `name` may not be an agent's `api_key_env` ("" when it may). The variable's
    value is sent as a bearer token to the URL the channel's operator chose, so it must
    be a key meant for that (…_API_KEY, or listed in AGENTLOOP_AGENT_KEY_ENVS), never
    SECRET_KEY, DATABASE_URL or another of the process's secrets."""
    if not isinstance(name, str) or not name:
        return "api_key_env must be the name of an environment variable"
    if KEY_ENV_PATTERN.fullmatch(name) or name in settings.AGENTLOOP_AGENT_KEY_ENVS:
        return ""
    return (f"api_key_env {name!r} is not allowed: name a variable ending in _API_KEY "
            "(or list it in AGENTLOOP_AGENT_KEY_ENVS)")


def validate_agent_config(config: object) -> None:
    """Refuse an agent configuration that would hand a process secret to an agent."""
    if not isinstance(config, dict):
        raise ValidationError({"agent_config": gettext("must be a JSON object")})
    if "api_key_env" in config:
        problem = key_env_problem(config["api_key_env"])
        if problem:
            raise ValidationError({"agent_config": problem})
    problem = transcription_problem(config.get("transcription"))
    if problem:
        raise ValidationError({"agent_config": problem})


TRANSCRIPTION_KEYS = {"base_url", "model", "api_key_env", "timeout", "language"}


def transcription_problem(value: object) -> str:
    """Why a channel's `transcription` setting (conversations.media.transcribe) is
    refused ("" when it is fine): an object of TRANSCRIPTION_KEYS, or false."""
    if value is False or value is None:
        return ""
    if not isinstance(value, dict):
        return "transcription must be an object (base_url, model, api_key_env, timeout, language) or false"
    unknown = set(value) - TRANSCRIPTION_KEYS
    if unknown:
        return f"transcription has unknown keys: {', '.join(sorted(unknown))}"
    if "api_key_env" in value:
        return key_env_problem(value["api_key_env"])
    return ""
