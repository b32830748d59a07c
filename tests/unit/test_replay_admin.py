"""The story page's recording download and "Replay…" page (issue 58): the form, the
report of a replay against another agent, its JSON, and who may do what."""

import json

import pytest
from django.test import Client

from conversations.ingest import Inbound, admit
from conversations.models import Channel, Conversation
from tests.unit.test_console_websockets import make_user

pytestmark = pytest.mark.django_db

OPERATE = ["view_auditevent", "change_channel"]


@pytest.fixture
def chat(make_channel):
    channel = make_channel("shop", agent="echo")
    admit(channel, Inbound(platform_message_id="m1", chat_id="c1", sender_id="c1", text="¿Abren el lunes?",
                           sender_name="Camila"))
    return Conversation.objects.get()


@pytest.fixture
def operator():
    client = Client()
    client.force_login(make_user("op", perms=OPERATE))
    return client


def test_the_story_links_the_recording_and_the_replay_whose_report_shows_both_runs(chat, operator):
    story = operator.get(f"/console/conversations/{chat.pk}/story/").content.decode()
    assert f"/console/conversations/{chat.pk}/recording.json" in story and "Replay…" in story

    download = operator.get(f"/console/conversations/{chat.pk}/recording.json?mask=1")
    assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
    assert "Camila" not in download.content.decode() and json.loads(download.content)["masked"] is True

    form = operator.get(f"/console/conversations/{chat.pk}/replay/")
    assert form.status_code == 200 and 'name="window_ms"' in form.content.decode()
    page = operator.post(f"/console/conversations/{chat.pk}/replay/", {"agent": "echo", "window_ms": "500"})
    html = page.content.decode()
    assert page.status_code == 200 and "Recorded and replayed" in html and "different" in html
    assert "¿Abren el lunes?" in html and "no such turn" in html  # echoed in the replay; never answered in the recording
    assert not Channel.objects.filter(kind="sandbox").exists()

    report = operator.post(f"/console/conversations/{chat.pk}/replay/", {"agent": "echo", "format": "json"})
    assert json.loads(report.content)["comparison"]["totals"]["replayed"]["turns"] == 1


def test_a_bad_configuration_is_said_on_the_page_and_unknown_conversations_are_404(chat, operator):
    page = operator.post(f"/console/conversations/{chat.pk}/replay/", {"window_ms": "40000"})
    assert "max_wait: shorter than the longest window" in page.content.decode()
    page = operator.post(f"/console/conversations/{chat.pk}/replay/", {"agent_config": "[1, 2]"})
    assert "must be a JSON object" in page.content.decode()
    assert operator.get("/console/conversations/424242/replay/").status_code == 404
    assert operator.get("/console/conversations/424242/recording.json").status_code == 404


def test_the_page_in_spanish_and_an_auditor_may_download_but_not_replay(chat, operator):
    assert operator.get(f"/console/conversations/{chat.pk}/replay/", HTTP_ACCEPT_LANGUAGE="es").status_code == 200
    auditor = Client()
    auditor.force_login(make_user("au", perms=["view_auditevent"]))
    assert auditor.get(f"/console/conversations/{chat.pk}/recording.json").status_code == 200
    assert auditor.get(f"/console/conversations/{chat.pk}/replay/").status_code == 403
    assert "Replay…" not in auditor.get(f"/console/conversations/{chat.pk}/story/").content.decode()


def test_on_sqlite_the_page_refuses_a_replay_against_a_model_which_would_hold_the_write_lock(chat, operator):
    from django.db import connection

    from agentloop.console.replay import playback, recording

    recorded = recording.export(chat.pk)
    model = playback.configuration_of({"agent": "openai", "model": "gpt-4.1-mini"})
    assert playback.holds_writers(model, recorded) == (connection.vendor == "sqlite")
    assert not playback.holds_writers(playback.configuration_of({"agent": "recorded"}), recorded)
    if connection.vendor == "sqlite":  # on PostgreSQL the replay would call the model: not from a test
        page = operator.post(f"/console/conversations/{chat.pk}/replay/", {"agent": "openai", "model": "m"})
        assert "holds the database&#x27;s write lock" in page.content.decode()
