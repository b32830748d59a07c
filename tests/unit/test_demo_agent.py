"""The demo agent's intents, run as the worker runs it, with its tools going through the
real guard on the test database (tool calls in a thread, as the worker does)."""

import asyncio
from datetime import datetime

import pytest
from asgiref.sync import sync_to_async

from conversations.agents import TurnContext
from conversations.demo_agent import DemoAgent, find_times, title_of
from tools import approvals, guard
from tools.models import CalendarEvent, Proposal
from tools.registry import Scope

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime(2026, 11, 30, 9, 0).astimezone()  # a Monday


def test_times_in_the_ways_people_write_them(settings):
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "Europe/Madrid"
    def labels(text):
        return [t.strftime("%a %d %H:%M") for t in find_times(text, NOW)]
    assert labels("Confirmo psicología el lunes y miércoles a las 10") == ["Mon 07 10:00", "Wed 02 10:00"]
    assert labels("book physio tomorrow at 9:30am") == ["Tue 01 09:30"]
    assert labels("el 3/12 16:00 por favor") == ["Thu 03 16:00"]
    assert labels("2026-12-05 11:15") == ["Sat 05 11:15"]
    assert labels("agéndame las horas en mi calendario") == []
    assert title_of("Confirmo las horas de psicología", True) == "Psicología"
    assert title_of("book it for monday at 9", False) == "Appointment"


def run(text, history=(), scope=Scope("contact:demo")):
    async def call_tool(name, arguments):
        outcome = await sync_to_async(guard.invoke, thread_sensitive=False)(name, arguments, scope, actor="demo")
        return outcome.for_model()

    async def load_history():
        return list(history)

    ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="demo", text=text, call_tool=call_tool,
                      load_history=load_history)
    return asyncio.run(DemoAgent().respond(ctx))


def test_the_incident_replayed_by_hand():
    first = run("Confirmo las horas de psicología: lunes y miércoles a las 10")
    assert first.count("✅ Agendado: Psicología") == 2
    second = run("Agéndame las horas en mi calendario",
                 history=[{"role": "user", "content": "Confirmo las horas de psicología: lunes y miércoles a las 10"},
                          {"role": "assistant", "content": first}])
    assert second.count("ℹ️ Ya estaba agendado: Psicología") == 2  # it obeyed; the guard said no
    assert CalendarEvent.objects.count() == 2


def test_list_email_hello_and_help(mailoutbox):
    run("book physio tomorrow at 9")
    listing = run("what's on my calendar? my events")
    assert "Your upcoming events:" in listing and "Physio" in listing
    sent = run("envía un correo a ana@example.com: asunto Recordatorio / mensaje Nos vemos el lunes")
    assert sent.startswith("⏳") and mailoutbox == []  # email_send needs a person's approval by default
    approvals.apply(Proposal.objects.get().pk, by="olga")
    assert mailoutbox[0].subject == "Recordatorio" and mailoutbox[0].body == "Nos vemos el lunes"
    assert run("hola").startswith("¡Hola!")
    assert "I can:" in run("what can you do")
