"""The crash matrix's agent, registered through the public extension point
(`AGENTLOOP_EXTRA_AGENTS=crash=tests.faults.agent.CrashAgent`): it answers every turn
with the text it was given (so each message can be found in a reply), and a message
asking to book makes one guarded calendar call (so effects can be counted)."""

from conversations.agents import Agent, TurnContext

BOOK = "#book"
EVENT = {"title": "Crash matrix check-up", "start_datetime": "2030-01-02T10:00"}


class CrashAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        lines = [f"re: {ctx.text}"]
        if BOOK in ctx.text:
            result = await ctx.call_tool("calendar_create_event", dict(EVENT))
            lines.append(f"calendar: {result['status']}")
        return "\n".join(lines)
