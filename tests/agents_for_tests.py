"""An agent for the tests, registered through the public extension point
(`AGENTLOOP_EXTRA_AGENTS=scripted=tests.agents_for_tests.ScriptedToolAgent`): like a
literal model, it makes the tool calls its channel's config lists on every turn, and
answers with what each call returned."""

import json

from conversations.agents import Agent, TurnContext


class ScriptedToolAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        lines = []
        for call in ctx.config.get("tool_calls", []):
            result = await ctx.call_tool(call["name"], call["arguments"])
            lines.append(json.dumps({"tool": call["name"], **result}, ensure_ascii=False, sort_keys=True))
        return "\n".join(lines) or ctx.text
