"""The agent of the cluster fault test, registered through the public extension point
(`AGENTLOOP_EXTRA_AGENTS=cluster=tests.cluster.agent.ClusterAgent`): it thinks for a
while like a model (config `delay`, seconds), then books what the messages ask for —
"book #N" is one guarded `calendar_create_event` (title "cluster booking N", a slot of
its own) — and answers naming the messages it answered. The answer is the same however
often the turn runs, so a second copy of it at the Bot API is a duplicate reply."""

import asyncio
import re
from datetime import datetime, timedelta

from conversations.agents import Agent, TurnContext

BOOKING = re.compile(r"book #(\d+)")
FIRST_SLOT = datetime(2027, 1, 4, 9, 0)


def booking(n):
    """The calendar event message N asks for: its own title and start."""
    start = FIRST_SLOT + timedelta(minutes=15 * int(n))
    return {"title": f"cluster booking {n}", "start_datetime": start.strftime("%Y-%m-%dT%H:%M")}


class ClusterAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        await asyncio.sleep(float(ctx.config.get("delay", 0.5)))
        for n in BOOKING.findall(ctx.text):
            await ctx.call_tool("calendar_create_event", booking(n))
        return f"answered: {ctx.text}"
