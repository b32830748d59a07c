"""The `openai` agent: any OpenAI-compatible server (OpenAI, Ollama, vLLM, llama.cpp…)
through the official SDK, with the registry's tools offered as functions.

Channel `agent_config`: `base_url`, `model` (required), `api_key_env` (the environment
variable holding the key; default OPENAI_API_KEY; only …_API_KEY names or those in
AGENTLOOP_AGENT_KEY_ENVS, checked on save and again here), `system_prompt`, `max_steps` (model
requests per turn, default 6), `timeout` (seconds per request, default 60), `history`
(messages of context, default 20), `temperature`.

A burst's files reach the model as content parts (conversations.media.for_agents):
images as `image_url` data URLs, documents with their text, voice notes with their
transcript (when configured), the rest described.

Streamed (`conversations.worker.streams`: the channel shows previews), the request asks for
`stream=True` and the text is yielded as it arrives; tool-call deltas are assembled as
the SDK assembles them (`ChatCompletionStreamState`) and a tool call runs only once the
model's message is complete, never on a partial delta. The streamed reply is every
step's text, in order (what the user watched appear). `stream: false` in the
agent_config asks for whole answers.

Every tool call goes through the action guard (`ctx.call_tool`); a duplicate comes back
as a success with a note, which the model reads like any other result. A provider
error or timeout ends the turn (AgentUnavailable): the user gets a short apology and the
turn is never re-run, because a tool may already have acted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import openai
from django.utils.translation import gettext_lazy
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # loaded now, not inside the first turn

from agentloop.core import languages
from agentloop.core.redaction import agent_secrets, redact
from conversations.agents import Agent, AgentUnavailable, Answer, JsonObject, TurnContext, key_env_problem
from conversations.media import for_agents
from conversations.model_clients import client_for

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageToolCall

# A stream asks for its usage, sent after its last chunk (OpenAI, vLLM, Ollama, llama.cpp's
# server and LM Studio all honour it): without it a streaming channel spent no budget.
STREAMED = {"stream": True, "stream_options": {"include_usage": True}}
log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that acts on the user's behalf with the tools you are given. "
    "Before repeating an action, read the conversation: if it was already done, say so instead of doing it "
    "again. When a tool result says it is a duplicate, do not retry; tell the user it was already done. "
    "Answer briefly, in the user's language."
)
STEP_LIMIT_REPLY = gettext_lazy("I could not finish that in one go; please tell me what is still missing.")

def _client(config: JsonObject) -> openai.AsyncOpenAI:
    env_name = config.get("api_key_env") or "OPENAI_API_KEY"
    problem = key_env_problem(env_name)
    if problem:  # a configuration written before the check, or straight into the database
        raise AgentUnavailable(problem)
    api_key = os.environ.get(env_name, "") or "not-needed"
    return client_for(config.get("base_url") or None, api_key, float(config.get("timeout", 60)))


async def user_content(ctx: TurnContext) -> str | list[JsonObject]:
    """The turn's text; with files, content parts: the text, then each file (an image as
    an image_url, a document with its text, the rest described). Read and downscaled on
    a thread: a burst of large images must not hold the event loop other turns run on."""
    if not ctx.media:
        return ctx.text
    return [{"type": "text", "text": ctx.text}, *await asyncio.to_thread(for_agents.parts, ctx.media)]


class OpenAIAgent(Agent):
    async def prepare(self, config: JsonObject) -> None:
        try:
            _client(config)  # the client and its connection pool now, not inside the first turn
        except AgentUnavailable as exc:
            log.warning("an openai channel cannot run: %s", exc)

    def streams_for(self, config: JsonObject) -> bool:
        return config.get("stream", True) is not False

    async def _conversation(self, ctx: TurnContext) -> tuple[openai.AsyncOpenAI, list[JsonObject], list[JsonObject]]:
        """The client, the messages so far and the tools offered."""
        config = ctx.config
        if not config.get("model"):
            raise AgentUnavailable("the channel's openai agent has no model configured")
        client = _client(config)
        messages: list[JsonObject] = [{"role": "system",
                                       "content": config.get("system_prompt") or DEFAULT_SYSTEM_PROMPT}]
        if ctx.load_history is not None:
            messages += (await ctx.load_history())[-int(config.get("history", 20)):]
        messages.append({"role": "user", "content": await user_content(ctx)})
        tools = await ctx.load_tools() if ctx.load_tools is not None else []
        notes = getattr(tools, "notes", None)  # tools left out this turn (an MCP server that does not answer)
        if notes:
            messages.insert(1, {"role": "system", "content": " ".join(notes)})
        return client, messages, tools

    async def respond(self, ctx: TurnContext) -> str:
        config = ctx.config
        client, messages, tools = await self._conversation(ctx)
        for _ in range(int(config.get("max_steps", 6))):
            message = await self._complete(client, config, messages, tools, ctx)
            if not message.tool_calls:
                return (message.content or "").strip() or languages.text_in(ctx.language, STEP_LIMIT_REPLY)
            messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            for call in message.tool_calls:
                # Only function tools are offered: no custom tool call comes back.
                result = await self._run_tool(ctx, call)  # type: ignore[arg-type]
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": json.dumps(result, ensure_ascii=False, default=str)})
        log.warning("turn %s: the model was still calling tools after %s steps", ctx.turn_id,
                    config.get("max_steps", 6))
        return languages.text_in(ctx.language, STEP_LIMIT_REPLY)

    async def stream(self, ctx: TurnContext) -> AsyncIterator[str | Answer]:
        config = ctx.config
        client, messages, tools = await self._conversation(ctx)
        said: list[str] = []
        for _ in range(int(config.get("max_steps", 6))):
            state = ChatCompletionStreamState()
            step: list[str] = []
            async with _charged_if_cut(ctx, messages, step) as charge:
                with _provider_errors(config):
                    chunks = await client.post("/chat/completions", cast_to=ChatCompletion,
                                               body={**_request(config, messages, tools), **STREAMED},
                                               stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk])
                    async with chunks:  # closed however the stream ends (a turn cancelled mid-stream)
                        async for chunk in chunks:
                            charge.started = True
                            state.handle_chunk(chunk)
                            text = chunk.choices[0].delta.content if chunk.choices else None
                            if text:
                                if said and not step:
                                    yield "\n\n"  # a new step's text starts a new paragraph
                                step.append(text)
                                yield text
                    completion = state.get_final_completion()
                    charge.reported = completion.usage is not None
            await _record_usage(ctx, completion)
            if not completion.choices:
                raise AgentUnavailable("the model returned no choices")
            message = completion.choices[0].message
            if step:
                said.append("".join(step))
            if not message.tool_calls:
                yield Answer("\n\n".join(said).strip() or languages.text_in(ctx.language, STEP_LIMIT_REPLY))
                return
            # The message is whole now: each call's arguments complete, checked before it runs.
            messages.append({"role": "assistant", "content": message.content, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}
                for call in message.tool_calls]})
            for call in message.tool_calls:
                result = await self._run_tool(ctx, call)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": json.dumps(result, ensure_ascii=False, default=str)})
        yield Answer("\n\n".join([*said, languages.text_in(ctx.language, STEP_LIMIT_REPLY)]))

    async def _complete(self, client: openai.AsyncOpenAI, config: JsonObject, messages: list[JsonObject],
                        tools: list[JsonObject], ctx: TurnContext | None = None) -> ChatCompletionMessage:
        kwargs = _request(config, messages, tools)
        # The SDK's generic POST, not chat.completions.create: create() first walks
        # the whole request through the SDK's typed-params transform (aliases, file
        # inputs, dates), a no-op for these plain-JSON messages that cost ~1.2 ms of
        # event-loop CPU per model request (measured; a fifth of the loop at 50 turns/s).
        # Same wire request, same errors, same parsed ChatCompletion. The provider's text
        # may quote the key ("Incorrect API key provided: …") or a URL with credentials:
        # masked (_provider_errors), before it becomes a turn's outcome or a log line.
        with _provider_errors(config):
            response = await client.post("/chat/completions", cast_to=ChatCompletion, body=kwargs)
        await _record_usage(ctx, response)
        if not response.choices:
            raise AgentUnavailable("the model returned no choices")
        return response.choices[0].message

    @staticmethod
    async def _run_tool(ctx: TurnContext, call: ChatCompletionMessageToolCall) -> JsonObject:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except ValueError:
            return {"status": "failed", "duplicate": False, "error": "the arguments were not valid JSON"}
        if not isinstance(arguments, dict):
            return {"status": "failed", "duplicate": False, "error": "the arguments must be a JSON object"}
        assert ctx.call_tool is not None, "the worker gives every turn it runs its tools"
        return await ctx.call_tool(call.function.name, arguments)


class _Charge:
    started = False  # the provider began to answer: it read the prompt
    reported = False  # it said what the request used


@contextlib.asynccontextmanager
async def _charged_if_cut(ctx: TurnContext | None, messages: list[JsonObject],
                          written: list[str]) -> AsyncIterator[_Charge]:
    """A stream cut after the provider began to answer (the person's `/stop`, an
    interrupt, a timeout) never gets to its usage chunk, yet the provider bills it: the
    turn is charged an estimate, about 4 characters a token of the prompt it read and the
    text it wrote, so that stopping a stream just before its end spends the person's
    token budget too (conversations.limits)."""
    charge = _Charge()
    try:
        yield charge
    except BaseException:
        if charge.started and not charge.reported and ctx is not None and ctx.record_usage is not None:
            read = len(json.dumps(messages, ensure_ascii=False, default=str))
            # Shielded: the turn's task is being cancelled, and the charge must still land.
            await asyncio.shield(ctx.record_usage(-(-(read + len("".join(written))) // 4)))
        raise


async def _record_usage(ctx: TurnContext | None, completion: ChatCompletion) -> None:
    """The tokens the provider says this request used, on the turn (conversations.limits).
    A streamed request asks for them (`stream_options.include_usage`): the provider sends
    them in a last chunk of their own."""
    usage = getattr(completion, "usage", None)
    if ctx is not None and ctx.record_usage is not None and usage is not None and usage.total_tokens:
        await ctx.record_usage(usage.total_tokens)


def _request(config: JsonObject, messages: list[JsonObject], tools: list[JsonObject]) -> JsonObject:
    kwargs: JsonObject = {"model": config["model"], "messages": messages}
    if tools:
        kwargs["tools"] = tools
    if "temperature" in config:
        kwargs["temperature"] = float(config["temperature"])
    return kwargs


@contextlib.contextmanager
def _provider_errors(config: JsonObject) -> Iterator[None]:
    """A provider's error or timeout, while a stream opens or mid-stream, as AgentUnavailable."""
    try:
        yield
    except openai.APITimeoutError as exc:
        raise AgentUnavailable(f"the model did not answer within {config.get('timeout', 60)} s") from exc
    except openai.APIError as exc:
        why = redact(f"{type(exc).__name__}: {exc}", agent_secrets({"api_key_env": "OPENAI_API_KEY", **config}))
        raise AgentUnavailable(f"the model provider failed: {why}") from exc
