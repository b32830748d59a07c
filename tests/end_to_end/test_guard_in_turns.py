"""Tool calls made by an agent inside turns run by the real worker process go through
the guard, scoped to the conversation's contact, and mark the turn as having acted."""

import json

import pytest

from audit.models import AuditEvent, EventKind
from conversations.models import Turn, TurnState
from tests.support.e2e import send, telegram_channel
from tools.models import CalendarEvent

pytestmark = pytest.mark.e2e
AGENT = {"AGENTLOOP_EXTRA_AGENTS": "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}
CALLS = [
    {"name": "calendar_create_event", "arguments": {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}},
    {"name": "calendar_create_event", "arguments": {"title": "Psicología", "start_datetime": "2026-12-08T10:00"}},
]


def test_the_incident_through_the_worker(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, agent="scripted", agent_config={"tool_calls": CALLS})
    web, _ = processes.web(wait=False), processes.worker(**AGENT)

    send(web, "tg", 101, "Confirmo las horas de psicología.")
    [first] = fake_telegram.wait_for("sendMessage", timeout=15)
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    second = fake_telegram.wait_for("sendMessage", count=2, timeout=15)[1]

    first_results = [json.loads(line) for line in first.params["text"].splitlines()]
    second_results = [json.loads(line) for line in second.params["text"].splitlines()]
    assert [r["status"] for r in first_results] == ["done", "done"]
    assert [r["status"] for r in second_results] == ["duplicate", "duplicate"]
    assert all("already carried out" in r["note"] for r in second_results)
    assert [r["result"] for r in second_results] == [r["result"] for r in first_results]
    assert CalendarEvent.objects.count() == 2
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 2
    turns = list(Turn.objects.order_by("pk"))
    assert [t.state for t in turns] == [TurnState.DONE, TurnState.DONE]
    assert all(t.fired_effect for t in turns)  # so double texting never cancels them
    assert {e.calendar.scope for e in CalendarEvent.objects.select_related("calendar")} == {
        f"contact:{turns[0].conversation.contact_id}"}
