"""The crash matrix's agent, registered through the public extension point
(`AGENTLOOP_EXTRA_AGENTS=crash=tests.faults.agent.CrashAgent`): it answers every turn
with the text it was given (so each message can be found in a reply), and a message
asking to book makes one guarded calendar call (so effects can be counted)."""

from conversations.agents import Agent, Answer, File, TurnContext

BOOK = "#book"
EVENT = {"title": "Crash matrix check-up", "start_datetime": "2030-01-02T10:00"}


class CrashAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str | Answer:
        lines = [f"re: {ctx.text}"]
        if BOOK not in ctx.text:
            return "\n".join(lines)
        result = await ctx.call_tool("calendar_create_event", dict(EVENT))
        lines.append(f"calendar: {result['status']}")
        # The booking's .ics goes after the text, a chunk of its own (ledger.after_upload);
        # its caption names the turn's text, so a second booking's file is no duplicate.
        return Answer("\n".join(lines), (File("booking.ics", ics(), caption=f"calendar file: {ctx.text}"[:300]),))


def ics() -> bytes:
    return (f"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//agentloop//crash matrix//EN\r\nBEGIN:VEVENT\r\n"
            f"UID:crash-matrix@agentloop\r\nDTSTART:20300102T100000\r\nSUMMARY:{EVENT['title']}\r\n"
            f"END:VEVENT\r\nEND:VCALENDAR\r\n").encode()
