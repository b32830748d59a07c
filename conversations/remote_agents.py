"""Agents that live in another service.

`webhook`: the merged turn is POSTed to the agent's URL, signed as callbacks are (see
`delivery.signing`: `X-Agentloop-Timestamp`, and `X-Agentloop-Signature: sha256=…` an
HMAC-SHA256 over "<timestamp>.<body>", key `secret` in the channel's agent_config).
A 200 answer with `{"reply": "…"}` is the reply (with `"files": [{"name", "data"
(base64), "caption"}]` it carries files, sent after the text through the ledger); a 202 (or 200 without a reply) hands
the turn over: the agent answers later through the API (`POST /api/v1/turns/<id>/reply`,
then `/done`), with an agent key for the channel. agent_config: `url`, `secret`,
`timeout` (default 30 s, for the whole exchange). The burst's files come as `media`:
each file's facts, its transcript or why it was not read, and a signed link to its
bytes (`url`, relative like `reply_url`, expiring after AGENTLOOP_MEDIA_URL_TTL).

`pull`: the worker never runs these turns; an external agent lists the ready ones,
claims one, replies and marks it done through the API. A claimed turn not finished
within AGENTLOOP_EXTERNAL_TURN_TIMEOUT is released to be claimed again.
"""

import asyncio
import base64
import json
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from agentloop.core.tls import shared_tls_context
from conversations.agents import Agent, AgentUnavailable, Answer, File, HandedOver, TurnContext
from conversations.media import for_agents
from delivery import signing


class WebhookAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str | Answer:
        config = ctx.config
        if not config.get("url"):
            raise AgentUnavailable("the channel's webhook agent has no url configured")
        history = await ctx.load_history() if ctx.load_history is not None else []
        body = json.dumps({
            "turn": ctx.turn_id, "conversation": ctx.conversation_id, "channel": ctx.channel_slug,
            "contact": ctx.contact_name, "text": ctx.text, "history": history,
            "media": [for_agents.for_remote(item) for item in ctx.media],
            "reply_url": f"/api/v1/turns/{ctx.turn_id}/reply", "done_url": f"/api/v1/turns/{ctx.turn_id}/done",
        }, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "X-Agentloop-Turn": str(ctx.turn_id)}
        if config.get("secret"):
            headers.update(signing.signed_headers(config["secret"], body))
        # Errors name the agent's host only: its URL may carry a key (…/hook?key=…).
        host = urlsplit(config["url"]).netloc.rpartition("@")[2]
        timeout = float(config.get("timeout", 30))
        limit = settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES
        try:
            # One deadline for the whole exchange: httpx's timeouts are per phase, and an
            # agent trickling a byte a second would never trip them.
            status, content = await asyncio.wait_for(
                self._post(config["url"], body, headers, timeout, limit), timeout)
        except AnswerTooLarge as exc:
            raise AgentUnavailable(f"the agent at {host} answered more than {limit} bytes "
                                   f"(AGENTLOOP_AGENT_MAX_ANSWER_BYTES): not read further") from exc
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise AgentUnavailable(f"the agent at {host} did not answer within {timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise AgentUnavailable(f"the agent at {host} could not be reached: {type(exc).__name__}") from exc
        if status == 202:
            raise HandedOver()
        if status >= 300:
            raise AgentUnavailable(f"the agent at {host} answered HTTP {status}")
        try:
            answer = json.loads(content) if content else {}
            reply, files = answer.get("reply"), answer.get("files") or []
        except (ValueError, AttributeError) as exc:
            raise AgentUnavailable(f"the agent at {host} answered something that is not a JSON object") from exc
        if not reply and not files:
            raise HandedOver()
        if not files:
            return str(reply)
        return Answer(str(reply or ""), files_from_json(files))

    @staticmethod
    async def _post(url, body, headers, timeout, limit):
        async with httpx.AsyncClient(timeout=timeout, verify=shared_tls_context()) as client:
            async with client.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code, await read_at_most(response, limit)


class AnswerTooLarge(Exception):
    pass


async def read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The answer's body, read as it streams in; past `limit` bytes reading stops (the
    connection is dropped): a service must not make a worker hold its whole answer."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(declared)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


def files_from_json(values) -> tuple[File, ...]:
    """An agent's `files` (`[{"name", "data": base64, "caption"}]`) as Files; one whose
    data is not base64 has none (conversations.media.outbound refuses it, in the reply)."""
    if not isinstance(values, list):
        values = [values]
    found = []
    for value in values:
        value = value if isinstance(value, dict) else {}
        try:
            data = base64.b64decode(value.get("data") or "", validate=True) or None
        except (ValueError, TypeError):
            data = None
        found.append(File(name=str(value.get("name") or "file"), data=data, caption=str(value.get("caption") or "")))
    return tuple(found)


class PullAgent(Agent):
    """Never run by the worker (its turns wait for an external agent); present so the
    name is a valid choice."""

    async def respond(self, ctx: TurnContext) -> str:
        raise HandedOver()
