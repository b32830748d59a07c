"""Agents that live in another service.

`webhook`: the merged turn is POSTed to the agent's URL, signed with HMAC-SHA256 of the
body (`X-Agentloop-Signature: sha256=…`, key `secret` in the channel's agent_config).
A 200 answer with `{"reply": "…"}` is the reply; a 202 (or 200 without a reply) hands
the turn over: the agent answers later through the API (`POST /api/v1/turns/<id>/reply`,
then `/done`), with an agent key for the channel. agent_config: `url`, `secret`,
`timeout` (default 30 s).

`pull`: the worker never runs these turns; an external agent lists the ready ones,
claims one, replies and marks it done through the API. A claimed turn not finished
within AGENTLOOP_EXTERNAL_TURN_TIMEOUT is released to be claimed again.
"""

import hashlib
import hmac
import json

import httpx

from conversations.agents import Agent, AgentUnavailable, HandedOver, TurnContext


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        config = ctx.config
        if not config.get("url"):
            raise AgentUnavailable("the channel's webhook agent has no url configured")
        history = await ctx.load_history() if ctx.load_history is not None else []
        body = json.dumps({
            "turn": ctx.turn_id, "conversation": ctx.conversation_id, "channel": ctx.channel_slug,
            "contact": ctx.contact_name, "text": ctx.text, "history": history,
            "reply_url": f"/api/v1/turns/{ctx.turn_id}/reply", "done_url": f"/api/v1/turns/{ctx.turn_id}/done",
        }, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "X-Agentloop-Turn": str(ctx.turn_id)}
        if config.get("secret"):
            headers["X-Agentloop-Signature"] = sign(config["secret"], body)
        try:
            async with httpx.AsyncClient(timeout=float(config.get("timeout", 30))) as client:
                response = await client.post(config["url"], content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise AgentUnavailable(f"the agent at {config['url']} did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise AgentUnavailable(f"the agent at {config['url']} could not be reached: {exc}") from exc
        if response.status_code == 202:
            raise HandedOver()
        if response.status_code >= 300:
            raise AgentUnavailable(f"the agent at {config['url']} answered HTTP {response.status_code}")
        try:
            reply = response.json().get("reply") if response.content else None
        except ValueError as exc:
            raise AgentUnavailable(f"the agent at {config['url']} answered something that is not JSON") from exc
        if not reply:
            raise HandedOver()
        return str(reply)


class PullAgent(Agent):
    """Never run by the worker (its turns wait for an external agent); present so the
    name is a valid choice."""

    async def respond(self, ctx: TurnContext) -> str:
        raise HandedOver()
