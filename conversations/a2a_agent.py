"""The `a2a` agent: a turn sent to a remote agent that speaks the Agent2Agent protocol
(A2A), with the official SDK (`a2a-sdk`).

Channel `agent_config`: `url` (the agent's address: its card is read from
`<url>/.well-known/agent-card.json`, or `card_path`), `api_key_env` (the environment
variable whose value is sent as `Authorization: Bearer …`, or in the header
`auth_header` names; the same names as the openai agent's, checked on save and again
here; never the value itself), `timeout` (seconds for the whole exchange, card
included; default 60), `stream` (false: `message/send` even where the channel streams),
`mark_effect` (declare an effect before sending: the turn is then never interrupted or
re-run, for a remote agent that acts on the world by other means than our guarded
tools).

- **One conversation, one context.** The first turn makes a contextId, kept per
  conversation (conversations.agent_sessions) and sent with every turn after it, so the
  remote agent sees one conversation; a /reset starts another.
- **Streaming.** Where the channel streams and the agent's card says it can, the turn
  is sent with `message/stream` and the text of its artifacts (and its answering status
  message) is yielded as it arrives: the previews of conversations.worker.streams. The final
  is the Answer, sent by the ledger.
- **input-required** makes the task's question the reply and keeps the task: the
  person's next message continues it (`taskId`). A task the remote agent no longer knows
  is left, and the message is sent as a new one.
- **Artifacts' files** (raw bytes, JSON data) are files of the reply (delivery.attachments).
- **Failures** (no card, a refused key, an HTTP or protocol error, a failed or canceled
  task, an answer over AGENTLOOP_AGENT_MAX_ANSWER_BYTES, the deadline) are
  AgentUnavailable, their text redacted and naming the agent's host only: the turn ends
  with an apology and is never re-run.
- **A cancelled turn** (/stop, an interrupt, shutdown, the deadline) sends tasks/cancel
  for a remote task still going, best effort within CANCEL_WITHIN.
- **Only the configured origin.** The card's interfaces at another scheme, host or port
  are not used: the key must not go where the operator did not send it.

The message carries the turn's ids in its metadata (`io.agentloop/conversation`,
`io.agentloop/turn`, `io.agentloop/channel`): a remote agent acting through agentloop's
own tools (/mcp, /api/v1/tools) names the conversation with them, behind the guard.
"""

import asyncio
import functools
import hashlib
import logging
import os
import re
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from agentloop.core.caches import BoundedCache
from agentloop.core.redaction import agent_secrets, redact
from agentloop.core.tls import shared_tls_context
from conversations import a2a_reading
from conversations.agents import Agent, AgentUnavailable, Answer, TurnCancelled, TurnContext, key_env_problem
from conversations.media import for_agents
from conversations.remote_agents import AnswerTooLarge, _host, _too_large

if TYPE_CHECKING:
    from a2a.types.a2a_pb2 import Message

log = logging.getLogger(__name__)

# Cards are read again after this long (an agent's card changes with its deployments).
CARDS: BoundedCache = BoundedCache(maxsize=128, max_age=300)
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
FORBIDDEN_HEADERS = {"host", "content-length", "content-type", "cookie", "transfer-encoding", "connection"}
POLL_EVERY = (0.25, 0.5, 1.0, 2.0)  # a task still working after its answer, looked at again
CANCEL_WITHIN = 5.0  # seconds for tasks/cancel once a turn is cancelled: its end is not held up longer


@functools.cache
def sdk() -> SimpleNamespace:
    """The a2a-sdk's names, imported when a worker prepares an A2A channel (or at the first
    A2A turn) rather than with this module: every worker imports every registered agent
    as it starts, and importing the SDK (its protobuf types, its client transports) costs
    0.13-0.16 s of CPU, which each worker start would pay even where no channel speaks
    A2A (the test suite starts hundreds of workers)."""
    from a2a.client import A2AClientTimeoutError, ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, Message, Part, Role, SendMessageRequest
    from a2a.utils.errors import A2AError, TaskNotFoundError
    from google.protobuf.json_format import ParseError

    return SimpleNamespace(**{value.__name__: value for value in (
        A2AClientTimeoutError, ClientConfig, ClientFactory, A2ACardResolver, CancelTaskRequest, GetTaskRequest,
        Message, Part, SendMessageRequest, A2AError, TaskNotFoundError, ParseError)}, Role=Role)


class A2AAgent(Agent):
    def streams_for(self, config):
        return config.get("stream", True) is not False

    async def prepare(self, config):
        sdk()  # a channel speaks A2A: imported now, not inside its first turn
        try:
            _headers(config)
        except AgentUnavailable as exc:
            log.warning("an a2a channel cannot run: %s", exc)

    async def respond(self, ctx: TurnContext) -> Answer:
        async for item in self._exchange(ctx, streaming=False):
            if isinstance(item, Answer):
                return item
        raise AgentUnavailable("the A2A exchange ended without an answer")

    async def stream(self, ctx: TurnContext):
        async for item in self._exchange(ctx, streaming=True):
            yield item

    async def _exchange(self, ctx: TurnContext, streaming: bool):
        """Text deltas as the remote agent writes (streamed), then the Answer."""
        config = ctx.config
        url = str(config.get("url") or "")
        if not url:
            raise AgentUnavailable("the channel's a2a agent has no url configured")
        host, timeout = _host(url), float(config.get("timeout", 60))
        headers = _headers(config)
        if config.get("mark_effect") and not await ctx.mark_effect():
            raise TurnCancelled()
        key = session_key(url)
        session = await ctx.load_session(key) if ctx.load_session is not None else {}
        reading = a2a_reading.Reading()
        a2a = sdk()
        try:
            # One deadline for the whole exchange: the SDK's timeouts are per request, and an
            # agent trickling events would never trip them. The turn's task awaits only inside
            # this generator, so the deadline's cancellation lands here.
            async with asyncio.timeout(timeout), _http_client(headers, timeout) as http:
                client = a2a.ClientFactory(a2a.ClientConfig(streaming=streaming, httpx_client=http)).create(
                    await _card(http, url, config))
                try:
                    try:
                        async for delta in _send(client, reading, ctx, session):
                            yield delta
                    except a2a.TaskNotFoundError:
                        if not session.get("task_id") or reading.previewed:
                            raise
                        session = {**session, "task_id": ""}  # forgotten by the agent: ask anew
                        async for delta in _send(client, reading, ctx, session):
                            yield delta
                    await _settle(client, reading)
                except (asyncio.CancelledError, GeneratorExit):
                    # The turn cancelled (/stop, an interrupt, shutdown) or past its deadline:
                    # the remote task would go on for nobody.
                    await _cancel_remote(Remote(client, host, ctx, key, session), reading)
                    raise
        except (TimeoutError, a2a.A2AClientTimeoutError) as exc:
            raise AgentUnavailable(f"the A2A agent at {host} did not answer within {timeout:g} s") from exc
        except AnswerTooLarge as exc:
            raise _too_large(host, settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES) from exc
        except (a2a.A2AError, httpx.HTTPError, a2a.ParseError, ValueError) as exc:
            raise AgentUnavailable(f"the A2A agent at {host} failed: {_why(exc, config)}") from exc
        await _keep(ctx, key, session, reading)
        yield _answer_of(reading, host, config)


@dataclass(frozen=True)
class Remote:
    """One exchange's remote end, for what is done after its turn was cancelled."""

    client: Any
    host: str
    ctx: TurnContext
    key: str  # the conversation's session with this agent
    session: dict


async def _cancel_remote(remote: Remote, reading) -> None:
    """Send tasks/cancel for the task this exchange was answered in, if it is still going:
    best effort, within CANCEL_WITHIN, shielded from the cancellation that brought us here
    (cancelled once more, by a shutdown, it is abandoned). The session's waiting task, if
    it is this one, is forgotten: the person's next message starts a new task."""
    if not reading.task_id or reading.settled:
        return  # not known yet (no event came), or already over
    job = asyncio.ensure_future(_ask_to_cancel(remote, reading.task_id))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        job.cancel()
        raise


async def _ask_to_cancel(remote: Remote, task_id: str) -> None:
    try:
        async with asyncio.timeout(CANCEL_WITHIN):
            await remote.client.cancel_task(sdk().CancelTaskRequest(id=task_id))
            if remote.session.get("task_id") == task_id and remote.ctx.save_session is not None:
                await remote.ctx.save_session(remote.key, {**remote.session, "task_id": ""}, new=False)
    except Exception as exc:  # best effort: the turn is over either way
        log.info("tasks/cancel to the A2A agent at %s failed: %s", remote.host, type(exc).__name__)


def session_key(url: str) -> str:
    """The conversation's session with this agent: one per URL (a conversation routed to
    two A2A agents has a context with each)."""
    return "a2a:" + hashlib.sha256(url.encode()).hexdigest()[:40]


def _headers(config) -> dict:
    """The key's header, its value read from the environment now (never stored)."""
    env_name = config.get("api_key_env")
    if not env_name:
        return {}
    problem = key_env_problem(env_name)
    if problem:  # a configuration written before the check, or straight into the database
        raise AgentUnavailable(problem)
    value = os.environ.get(env_name, "")
    if not value:
        raise AgentUnavailable(f"the environment variable {env_name} is empty: the A2A agent's key is missing")
    name = str(config.get("auth_header") or "Authorization")
    if not HEADER_NAME.fullmatch(name) or name.lower() in FORBIDDEN_HEADERS:
        raise AgentUnavailable(f"auth_header {name!r} is not a header the key may be sent in")
    return {name: f"Bearer {value}" if name.lower() == "authorization" else value}


def _http_client(headers, timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers=headers, timeout=timeout, follow_redirects=False,
                             transport=CappedTransport(settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES,
                                                       verify=shared_tls_context()))


async def _card(http, url, config):
    """The agent's card (cached a while), with only the interfaces at the URL's origin."""
    card_path = config.get("card_path") or None
    cached = CARDS.get((url, card_path))
    if cached is None:
        cached = CARDS.set((url, card_path), await sdk().A2ACardResolver(http, url).get_agent_card(
            relative_card_path=card_path))
    card = type(cached)()
    card.CopyFrom(cached)
    origin = _origin(url)
    kept = [interface for interface in card.supported_interfaces if _origin(interface.url) == origin]
    if not kept:
        raise AgentUnavailable(f"the A2A agent's card at {_host(url)} names no interface at {_host(url)} "
                               "(another host is not sent the key)")
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(kept)
    return card


def _origin(url) -> tuple:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


async def _send(client, reading, ctx, session):
    request = sdk().SendMessageRequest(message=_message(ctx, session))
    async for event in client.send_message(request):
        delta = reading.take(event)
        if delta:
            yield delta


def _message(ctx: TurnContext, session: dict) -> "Message":
    a2a = sdk()
    message = a2a.Message(role=a2a.Role.ROLE_USER, message_id=str(uuid.uuid4()),
                      context_id=session.get("context_id") or str(uuid.uuid4()),
                      task_id=session.get("task_id") or "", parts=[a2a.Part(text=ctx.text)])
    # The burst's files, described (what they are, a voice note's transcript): their bytes
    # are not sent yet.
    for item in ctx.media:
        line = for_agents.describe(item)
        message.parts.append(a2a.Part(text=f"{line}\n{item.transcript}" if item.transcript else line))
    message.metadata.update({"io.agentloop/conversation": ctx.conversation_id, "io.agentloop/turn": ctx.turn_id,
                             "io.agentloop/channel": ctx.channel_slug})
    return message


async def _settle(client, reading):
    """A task still submitted or working when its answer ended (an agent answering at once
    and working on): looked at again (`tasks/get`) until it settles, within the deadline."""
    for index in range(10_000):
        if reading.settled or not reading.task_id:
            return
        await asyncio.sleep(POLL_EVERY[min(index, len(POLL_EVERY) - 1)])
        reading.take_task(await client.get_task(sdk().GetTaskRequest(id=reading.task_id)))


async def _keep(ctx, key, session, reading):
    """The context for the next turns, and the task if it waits for the person."""
    if ctx.save_session is None:
        return
    context_id = reading.context_id or session.get("context_id", "")
    waiting = reading.task_id if reading.state == a2a_reading.INPUT_REQUIRED else ""
    state = {"context_id": context_id, "task_id": waiting}
    if state != {"context_id": session.get("context_id", ""), "task_id": session.get("task_id", "")}:
        await ctx.save_session(key, state, new=context_id != session.get("context_id"))


def _answer_of(reading, host, config) -> Answer:
    if not reading.settled:
        raise AgentUnavailable(f"the A2A agent at {host} ended the exchange with its task {reading.state_name}")
    if not reading.direct and reading.state not in a2a_reading.ANSWERED:
        said = f": {redact(reading.status_text, agent_secrets(config))[:200]}" if reading.status_text else ""
        raise AgentUnavailable(f"the A2A agent at {host} ended its task {reading.state_name}{said}")
    answer = reading.answer()
    if not answer.text and not answer.files:
        raise AgentUnavailable(f"the A2A agent at {host} answered nothing")
    return answer


def _why(exc, config) -> str:
    """An error's text without secrets, and without URLs (they may carry a key)."""
    text = re.sub(r"https?://\S+", "<url>", f"{type(exc).__name__}: {exc}")
    return redact(text, agent_secrets(config))[:200]


# --- answers read capped ------------------------------------------------------------------


class CappedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, each answer's bytes counted as they arrive: past `limit`,
    AnswerTooLarge (the connection is dropped). The SDK reads the answers (JSON, or a
    stream of events), so the bound is put under it."""

    def __init__(self, limit: int, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await response.aclose()
            raise AnswerTooLarge(declared)
        response.stream = _Capped(response.stream, self.limit)
        return response


class _Capped(httpx.AsyncByteStream):
    def __init__(self, stream, limit):
        self.stream, self.limit = stream, limit

    async def __aiter__(self):
        size = 0
        async for chunk in self.stream:
            size += len(chunk)
            if size > self.limit:
                raise AnswerTooLarge(size)
            yield chunk

    async def aclose(self):
        await self.stream.aclose()
