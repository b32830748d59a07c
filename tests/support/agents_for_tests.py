"""An agent for the tests, registered through the public extension point
(`AGENTLOOP_EXTRA_AGENTS=scripted=tests.support.agents_for_tests.ScriptedToolAgent`): like a
literal model, it makes the tool calls its channel's config lists on every turn, and
answers with what each call returned."""

import json

from conversations.agents import Agent, Answer, EchoAgent, File, TurnContext


class ScriptedToolAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        lines = []
        for call in ctx.config.get("tool_calls", []):
            result = await ctx.call_tool(call["name"], call["arguments"])
            lines.append(json.dumps({"tool": call["name"], **result}, ensure_ascii=False, sort_keys=True))
        return "\n".join(lines) or ctx.text


class FilesAgent(Agent):
    """Answers with files (`files=tests.support.agents_for_tests.FilesAgent`): two photos (an
    album on Telegram) and a booking's .ics, after its text."""

    async def respond(self, ctx: TurnContext) -> Answer:
        from tests.faults.agent import ics

        return Answer(f"Agendado: {ctx.text}", (File("uno.jpg", jpeg(1)), File("dos.jpg", jpeg(2)),
                                                File("cita.ics", ics(), caption="Tu cita")))


def jpeg(seed: int, side: int = 64) -> bytes:
    """A small real JPEG, different per seed."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side), (seed * 40 % 256, 90, 200)).save(out, "JPEG")
    return out.getvalue()


class EchoFileAgent(EchoAgent):
    """The echo agent (streamed with `stream_pace` in its config), which answers a text
    asking for "the file" with that text as a file too (`notes.txt`): a reply whose
    stored bytes are the person's own words (tests/unit/test_erasure_everywhere.py)."""

    async def stream(self, ctx: TurnContext):
        async for item in super().stream(ctx):
            yield self.with_file(ctx, item) if isinstance(item, Answer) else item

    async def respond(self, ctx: TurnContext) -> Answer:
        return self.with_file(ctx, Answer(await super().respond(ctx)))

    @staticmethod
    def with_file(ctx: TurnContext, answer: Answer) -> Answer:
        if "the file" not in ctx.text:
            return answer
        return Answer(answer.text, (File("notes.txt", f"Your notes: {ctx.text}\n".encode()),))


class NamedEchoAgent(Agent):
    """An echo that says who it is (`named=tests.support.agents_for_tests.NamedEchoAgent`): its
    config's `name`, then the last line it read (a group turn's last line is the burst
    addressed to it), after an @mention of its config's `mention` if any — two of them
    in a group mention each other back and forth (tests/end_to_end/test_bot_loops.py)."""

    async def respond(self, ctx: TurnContext) -> str:
        lines = ctx.text.strip().splitlines()
        said = f"({ctx.config.get('name', 'echo')}) {lines[-1][-120:] if lines else ''}".strip()
        mention = ctx.config.get("mention")
        return f"@{mention} {said}" if mention else said
