"""A replay: a recording's messages admitted again, at their recorded offsets, into a
sandbox copy of its channel, with a chosen agent configuration — through the real intake
(`admit`, edits, deletions), the buffer and its windows (`flush_many`), turns, the
guard and the ledger — in virtual time: the clock jumps from one thing due to the next
(a message, a window's deadline, a turn's end), so a day-long conversation replays in
seconds with the same windows.

Everything happens inside one transaction that is rolled back at the end: the sandbox
channel, its conversation, turns, claims, ledger rows and audit events are never seen by
a worker, a poller, a dashboard or a metric (live events and counters are published
after a commit that never comes), and guarded tools run their stub (tools.sandbox), not
their effect. What a replay reads back before the rollback is its result.

Simplifications, said here once: a turn's agent runs at the turn's start in virtual
time and its end is written at start + latency (the recorded latency with recorded
answers, else the agent's own); taps are not replayed (a sandbox question is never
answered); files are not fetched (a media message keeps its type, so its window); the
guard's own windows (a claim's expiry) read the wall clock.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Field, Min, QuerySet
from django.utils import timezone

from agentloop.console.replay import document, recording
from agentloop.console.replay.document import Document
from agentloop.console.replay.recorded_agent import NAME as RECORDED
from agentloop.console.replay.recorded_agent import Answers, RecordedAgent
from agentloop.console.replay.turn_step import Ran, TurnStep, deliver
from conversations import deletions, edits, ingest
from conversations.agents import Agent, agent_for
from conversations.flushing import flush_many
from conversations.models import BufferState, Channel, Conversation, InboundMessage, MessageBuffer, Turn, TurnState
from conversations.platforms.sandbox import KIND as SANDBOX
from conversations.platforms.sandbox.transport import SandboxTransport
from tools import guard, sandbox

MAX_STEPS = 10_000  # a bound on the virtual clock's steps: a recording that never settles is refused


class ReplayError(ValueError):
    """A replay that cannot run as asked (an unknown agent, windows that contradict each other)."""


@dataclass(frozen=True)
class Configuration:
    """What a replay changes of the recorded channel: its agent (`recorded`: the recording's
    own answers), keys merged over its agent_config (model, system_prompt…), the tools
    its agent may call (None: all), and channel settings (windows, double_texting…)."""

    agent: str = ""
    agent_config: dict[str, Any] = field(default_factory=dict)
    tools: list[str] | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def describe(self, recorded: dict[str, Any]) -> dict[str, Any]:
        return {"agent": self.agent or recorded.get("agent", ""), "agent_config": self.agent_config,
                "tools": self.tools, "settings": self.settings}


# The windows a text gets (conversations.windows): what `window_ms` sets, all four at once.
TEXT_WINDOWS = ("window_closed", "window_greeting", "window_open", "window_neutral")
OPTIONS = ("agent", "agent_config", "tools", "settings", "window_ms", "double_texting", "model", "system_prompt")


def configuration_of(data: dict[str, Any]) -> Configuration:
    """A Configuration from JSON (a suite's, the admin form's, the command's options):
    `window_ms` sets the four text windows, `double_texting` the rule, `model` and
    `system_prompt` go into the agent_config."""
    unknown = sorted(set(data) - set(OPTIONS))
    if unknown:
        raise ReplayError(f"unknown replay option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    for key, kind in (("agent_config", dict), ("settings", dict), ("tools", list)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise ReplayError(f"{key} must be a JSON {'object' if kind is dict else 'list'}")
    channel_settings = dict(data.get("settings") or {})
    if data.get("window_ms") is not None:
        seconds = float(data["window_ms"]) / 1000
        channel_settings.update({name: seconds for name in TEXT_WINDOWS})
    if data.get("double_texting"):
        channel_settings["double_texting"] = data["double_texting"]
    agent_config = dict(data.get("agent_config") or {})
    agent_config.update({key: data[key] for key in ("model", "system_prompt") if data.get(key)})
    tools = data.get("tools")
    return Configuration(agent=str(data.get("agent") or ""), agent_config=agent_config,
                         tools=[str(name) for name in tools] if tools is not None else None, settings=channel_settings)


# The agents that answer at once, without calling out: a replay with one of them holds its
# transaction for a fraction of a second.
LOCAL_AGENTS = (RECORDED, "demo", "echo")


def holds_writers(configuration: Configuration, recorded: Document) -> bool:
    """Whether this replay would keep the live product's writers waiting while a model
    answers: on SQLite its transaction holds the database's one write lock (BEGIN
    IMMEDIATE) from its start, so a replay against a model — seconds, minutes — stalls
    intake and the workers meanwhile. PostgreSQL locks only the replay's own rows."""
    agent = configuration.agent or recorded["settings"].get("agent") or "echo"
    return connection.vendor == "sqlite" and agent not in LOCAL_AGENTS


def _setting(name: str, value: Any) -> Any:
    """A channel setting's value as its field takes it ("5" for a window: 5.0), or ReplayError."""
    if name not in document.SETTINGS:
        raise ReplayError(f"unknown channel setting {name!r}; known: {', '.join(document.SETTINGS)}")
    field = Channel._meta.get_field(name)
    assert isinstance(field, Field), "the recorded settings are the channel's own columns"
    try:
        value = field.to_python(value)
        if field.choices and value not in {choice for choice, _ in field.flatchoices}:
            raise ValidationError(f"must be one of {', '.join(str(c) for c, _ in field.flatchoices)}")
    except ValidationError as exc:
        raise ReplayError(f"{name}: {' '.join(exc.messages)}") from None
    return value


class _RolledBack(Exception):
    """Leaves the replay's transaction, undoing it, with its result read."""

    def __init__(self, result: Document) -> None:
        self.result = result


def replay(recorded: Document, configuration: Configuration) -> Document:
    """Replay a recording (checked first: RecordingError) with `configuration`; its result."""
    document.check(recorded)
    try:
        with sandbox.sandboxed(), transaction.atomic():
            raise _RolledBack(_Playback(recorded, configuration).run())
    except _RolledBack as done:
        return done.result
    finally:
        # A tool's policy row made (with its defaults) inside the replay was rolled back
        # with it: no process cache may keep it.
        guard.forget_policies()


class _Playback:
    def __init__(self, recorded: Document, configuration: Configuration) -> None:
        self.recorded, self.configuration = recorded, configuration
        self.channel = self.sandbox_channel()
        self.answers = Answers(recorded["happened"].get("turns") or [])
        self.steps = TurnStep(configuration.tools)
        self.start = timezone.now()  # virtual time starts now: the guard's windows read the wall clock
        self.calls: dict[int, list[dict[str, Any]]] = {}
        self.skipped: list[str] = []

    # --- the sandbox channel ------------------------------------------------------------

    def sandbox_channel(self) -> Channel:
        recorded, configuration = self.recorded["settings"], self.configuration
        name = configuration.agent or recorded.get("agent") or "echo"
        if name != RECORDED and name not in settings.AGENTLOOP_AGENTS:
            raise ReplayError(f"unknown agent {name!r}; known: {', '.join(sorted([*settings.AGENTLOOP_AGENTS, RECORDED]))}")
        channel = Channel(slug=f"replay-{uuid.uuid4().hex[:12]}", kind=SANDBOX, name="Replay")
        for key, value in {**recorded, **configuration.settings}.items():
            setattr(channel, key, _setting(key, value))
        channel.agent = "echo" if name == RECORDED else name  # the field names a registered agent
        channel.agent_config = {**(recorded.get("agent_config") or {}), **configuration.agent_config}
        refused = channel.unworkable()
        refused.pop("agent", None)
        if refused:
            raise ReplayError("; ".join(f"{key}: {message}" for key, message in refused.items()))
        channel.save()
        self.agent_name = name
        return channel

    # --- the virtual clock --------------------------------------------------------------

    def run(self) -> Document:
        try:
            return self.played()
        finally:
            SandboxTransport.taken(self.channel.pk)  # what it was sent is in the result, or gone with the replay

    def played(self) -> Document:
        began = time.monotonic()
        events = sorted(self.recorded["events"], key=lambda e: e["at_ms"])
        clock, running, index = self.start, None, 0
        for _ in range(MAX_STEPS):
            due = [self.start + timedelta(milliseconds=events[index]["at_ms"])] if index < len(events) else []
            due += [running.ends_at] if running else []
            deadline = self.next_deadline()
            due += [deadline] if deadline and not running else []
            if not due and not self.ready():
                return self.result(clock, began)
            clock = max(clock, min(due)) if due else clock
            if running and running.ends_at <= clock:
                TurnStep.finish(running)
                running = None
            while index < len(events) and self.start + timedelta(milliseconds=events[index]["at_ms"]) <= clock:
                self.apply(events[index], clock)
                index += 1
            if running and self.cancelled(running):  # interrupt, rollback, /stop: a worker stops it at once
                running = None
            self.flush(clock)
            running = running or self.start_next(clock)
            for conversation in self.conversations():
                deliver(conversation, clock)
        raise ReplayError(f"the replay did not settle within {MAX_STEPS} steps")

    @staticmethod
    def cancelled(running: Ran) -> bool:
        return Turn.objects.filter(pk=running.turn.pk, state=TurnState.CANCELLED).exists()

    def conversations(self) -> list[Conversation]:
        return list(Conversation.objects.filter(channel=self.channel).select_related("channel", "contact"))

    def open_buffers(self) -> QuerySet[MessageBuffer]:
        """This channel's open buffers whose conversation has no turn ready or running (enqueue: they wait)."""
        busy = Turn.objects.filter(conversation__channel=self.channel, state__in=Turn.ACTIVE).values("conversation_id")
        return MessageBuffer.objects.filter(conversation__channel=self.channel, state=BufferState.OPEN) \
            .exclude(conversation_id__in=busy)

    def next_deadline(self) -> datetime | None:
        found: datetime | None = self.open_buffers().aggregate(at=Min("flush_at"))["at"]
        return found

    def flush(self, now: datetime) -> None:
        due = list(self.open_buffers().filter(flush_at__lte=now).values_list("pk", flat=True))
        if due:
            flush_many(due, now)

    def ready(self) -> Turn | None:
        return (Turn.objects.filter(conversation__channel=self.channel, state=TurnState.READY)
                .select_related("conversation__channel", "conversation__contact").order_by("created_at", "pk").first())

    def start_next(self, now: datetime) -> Ran | None:
        turn = self.ready()
        if turn is None:
            return None
        agent, latency = self.agent_for(turn)
        ran = self.steps.run(turn, agent, dict(self.channel.agent_config), now, latency)
        if ran is not None:
            self.calls[turn.pk] = ran.calls
        return ran

    def agent_for(self, turn: Turn) -> tuple[Agent, timedelta | None]:
        if self.agent_name != RECORDED:
            return agent_for(self.agent_name), None
        merged = InboundMessage.objects.filter(buffer_id=turn.buffer_id).values_list("platform_message_id", flat=True)
        answer = self.answers.for_messages(merged)
        return RecordedAgent(answer), timedelta(milliseconds=answer.latency_ms)

    # --- what came in ----------------------------------------------------------------------

    def apply(self, event: dict[str, Any], now: datetime) -> None:
        who = self.recorded["conversation"]
        chat, sender = str(who.get("chat") or "chat"), str(event.get("sender") or who.get("sender") or "sender")
        if event["type"] == "message":
            try:
                ingest.admit(self.channel, ingest.Inbound(
                    platform_message_id=event["id"], chat_id=chat, sender_id=sender, text=event.get("text") or "",
                    sender_name=event.get("sender_name") or "", media_type=event.get("media_type") or "",
                    album_id=event.get("album") or "", is_group=bool(who.get("is_group")), sent_at=now), now)
            except ingest.Unstorable as exc:
                self.skipped.append(f"message {event['id']}: {exc}")
        elif event["type"] == "edit":
            edits.apply(self.channel, edits.Edit(event["of"], event.get("text") or "", now, SANDBOX, chat, sender), now)
        elif event["type"] == "delete":
            deletions.apply(self.channel, deletions.Deletion(event["of"], now, SANDBOX, chat, sender), now)
        else:
            self.skipped.append(f"{event['type']} at {event['at_ms']} ms: taps are not replayed")

    # --- the result --------------------------------------------------------------------

    def result(self, clock: datetime, began: float) -> Document:
        conversations = self.conversations()
        happened = recording.happened(conversations[0], self.calls) if conversations else {"turns": [], "replies": []}
        return {"configuration": self.configuration.describe(self.recorded["settings"]),
                "virtual_ms": round((clock - self.start).total_seconds() * 1000),
                "wall_ms": round((time.monotonic() - began) * 1000),
                "happened": happened, "sent": [sent.text for sent in SandboxTransport.sent.get(self.channel.pk, [])],
                "skipped": self.skipped}
