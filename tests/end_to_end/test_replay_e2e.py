"""Replay (issue 58) of a conversation that really happened: the incident of the seeds
sent through the Telegram fake to a real web server and worker, exported as a recording,
then replayed (in this process, in virtual time) with the recorded answers — the same
merges, turns, guard outcomes and replies — and with a longer window, which merges the
two messages into one turn. Neither replay reaches Telegram."""

import json

import pytest
from django.core.management import call_command

from agentloop.console.replay import comparison, document, playback
from conversations.models import Conversation, Turn
from tests.support.e2e import send, telegram_channel

pytestmark = pytest.mark.e2e


def test_a_recorded_telegram_conversation_replays_the_same_and_a_longer_window_merges_it(
        processes, make_channel, fake_telegram, tmp_path):
    telegram_channel(make_channel, fake_telegram, agent="demo")
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Confirmo las horas de psicología: lunes y miércoles a las 10")
    fake_telegram.wait_for("sendMessage", count=1, timeout=20)
    send(web, "tg", 101, "Agéndame las horas en mi calendario")
    fake_telegram.wait_for("sendMessage", count=2, timeout=20)

    path = tmp_path / "recording.json"
    call_command("recording", "export", conversation=Conversation.objects.get().pk, output=str(path))
    recorded = document.read(path)
    assert [e["type"] for e in recorded["events"]] == ["message", "message"]
    assert [[c["guard"] for c in t["tools"]] for t in recorded["happened"]["turns"]] == [
        ["executed", "executed"], ["duplicate_prevented", "duplicate_prevented"]]
    assert [r["outcome"] for r in recorded["happened"]["replies"]] == ["delivered", "delivered"]

    same = comparison.report(recorded, playback.replay(recorded, playback.configuration_of({"agent": "recorded"})))
    assert same["comparison"]["same"], json.dumps(same["comparison"]["turns"], ensure_ascii=False)
    assert same["sent"] == [r["text"] for r in recorded["happened"]["replies"]]

    gap = recorded["events"][1]["at_ms"]
    merged = comparison.report(recorded, playback.replay(recorded, playback.configuration_of(
        {"agent": "recorded", "window_ms": gap + 1000, "settings": {"max_wait": 15.0}})))["comparison"]
    ids = [e["id"] for e in recorded["events"]]
    assert merged["merges"] == {"recorded": [[ids[0]], [ids[1]]], "replayed": [ids]}

    assert len(fake_telegram.calls("sendMessage")) == 2, "a replay sent to Telegram"
    assert Turn.objects.count() == 2 and all(t.conversation.channel.kind == "telegram" for t in Turn.objects.all())
