"""Tools that exist only for the tests, registered through the public extension point
(`AGENTLOOP_TOOLS` / `AGENTLOOP_EXTRA_TOOLS`): a tool whose run waits on a gate (to hold
a claim in flight), a tool that fails a given number of times, a calendar create
that hangs after the event is written (so a test can kill its process between the
effect and the confirmation), and a tool whose effect writes a file (a replay must not)."""

import os
import threading
import time
from pathlib import Path

from tools.builtin.calendar import CreateEvent
from tools.registry import Effect, Tool, ToolError


class GatedCreate(Tool):
    name = "gated_create"
    description = "Makes a thing, once the test opens the gate."
    parameters = {"type": "object", "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
                  "required": ["name"], "additionalProperties": False}
    effect = Effect.CREATE
    fingerprint_fields = ("name",)
    gate = threading.Event()
    entered = threading.Event()
    runs: list = []

    @classmethod
    def reset(cls):
        cls.gate, cls.entered, cls.runs = threading.Event(), threading.Event(), []

    def run(self, call):
        type(self).entered.set()
        if not type(self).gate.wait(20):
            raise ToolError("the test never opened the gate")
        type(self).runs.append(call.arguments)
        return {"made": call.arguments["name"]}


class FlakyCreate(Tool):
    name = "flaky_create"
    parameters = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    effect = Effect.CREATE
    failures_left = 0
    runs: list = []

    def run(self, call):
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            raise ToolError("the backend said no")
        type(self).runs.append(call.arguments)
        return {"made": call.arguments["name"]}


class CreateEventThenHang(CreateEvent):
    """Writes the event, tells the test (a marker file), then never returns."""

    name = "calendar_create_event_then_hang"

    def run(self, call):
        result = super().run(call)
        marker = os.environ.get("AGENTLOOP_TEST_MARKER")
        if marker:
            Path(marker).write_text(result["event_id"])
        while True:
            time.sleep(1)


class AmbiguousCreate(Tool):
    """Loses its connection after the request went out, every time."""

    name = "ambiguous_create"
    parameters = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    effect = Effect.CREATE

    def run(self, call):
        from tools.registry import OutcomeUnknown

        raise OutcomeUnknown("the connection dropped after sending")


class LeakyCreate(Tool):
    """Fails the way a careless integration does: its error quotes the partner's API key
    (the value of PARTNER_API_KEY) and a URL with credentials."""

    name = "leaky_create"
    parameters = {"type": "object", "properties": {"name": {"type": "string"}, "crash": {"type": "boolean"}},
                  "required": ["name"]}
    effect = Effect.CREATE
    fingerprint_fields = ("name",)

    def run(self, call):
        key = os.environ.get("PARTNER_API_KEY", "")
        text = f"the partner refused key {key} at https://bot:{key}@partner.example/v1"
        if call.arguments.get("crash"):
            raise RuntimeError(text)
        raise ToolError(text)


class CreateEventAtGate(CreateEvent):
    """A calendar create that, across processes, tells the test it started (the file
    AGENTLOOP_TEST_MARKER) and waits (20 s at most) for the test to create the file
    AGENTLOOP_TEST_GATE before it writes the event: a request held in flight."""

    name = "calendar_create_event_at_gate"

    def run(self, call):
        Path(os.environ["AGENTLOOP_TEST_MARKER"]).write_text("entered")
        gate, deadline = Path(os.environ["AGENTLOOP_TEST_GATE"]), time.monotonic() + 20
        while not gate.exists():
            if time.monotonic() > deadline:
                raise ToolError("the test never opened the gate")
            time.sleep(0.02)
        return super().run(call)


class WriteNote(Tool):
    """A guarded tool whose effect writes a file (`path`): the replay's proof that a
    sandboxed call runs the guard but never the effect."""

    name = "write_note"
    description = "Writes a note to a file."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                  "required": ["path", "text"], "additionalProperties": False}
    effect = Effect.CREATE

    def run(self, call):
        Path(call.arguments["path"]).write_text(call.arguments["text"], encoding="utf-8")
        return {"written": call.arguments["path"]}
