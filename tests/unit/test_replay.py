"""Replay (issue 58): a recording replayed in virtual time through the real intake,
buffer, turns, guard and ledger, on a sandbox channel inside a rolled-back transaction;
compared with what was recorded; suites of recordings with expectations."""

import copy
import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agentloop.console.replay import comparison, document, playback, recording, suites
from agentloop.console.replay.document import RecordingError
from conversations import edits
from conversations.ingest import Inbound, MediaRef, admit
from conversations.models import Channel, Conversation, InboundMessage, Turn
from delivery.models import OutboundMessage
from tools import guard
from tools.models import ActionClaim, CalendarEvent
from tools.registry import Scope

pytestmark = pytest.mark.django_db

INCIDENT = Path(__file__).resolve().parents[2] / "replays" / "incident.json"


@pytest.fixture
def incident():
    return document.read(INCIDENT)


def replayed(recorded, **options):
    return playback.replay(recorded, playback.configuration_of(options))


def nothing_left_behind():
    """A replay's rows are rolled back: no sandbox channel, no turn, claim, event or ledger row."""
    assert not Channel.objects.filter(kind="sandbox").exists()
    assert not Turn.objects.exists() and not ActionClaim.objects.exists()
    assert not CalendarEvent.objects.exists() and not OutboundMessage.objects.exists()


def test_the_incident_against_the_demo_agent_books_two_events_and_the_guard_stops_two_duplicates(incident):
    began = time.monotonic()
    result = replayed(incident, agent="demo")
    totals = comparison.totals(result["happened"])
    assert (totals["turns"], totals["executed"], totals["duplicates_prevented"]) == (2, 2, 2)
    assert comparison.merges(result["happened"]) == [["message-1"], ["message-2"]]
    assert [t["flush_reason"] for t in result["happened"]["turns"]] == ["window", "window"]
    assert result["sent"][1].startswith("ℹ️ Ya estaba agendado: Psicología")
    # Virtual time: 12 s of conversation and its windows, replayed faster than they took (well
    # under a second alone; 5.5 s once, in the backfill at idle priority beside the alone phase).
    assert result["virtual_ms"] >= 12000 + 2500 and time.monotonic() - began < result["virtual_ms"] / 1000
    nothing_left_behind()


def test_recorded_answers_reproduce_the_recording_and_a_longer_window_merges_the_burst(incident):
    same = comparison.report(incident, replayed(incident, agent="recorded"))["comparison"]
    assert same["same"] and same["same_merges"], same["turns"]
    assert same["totals"]["replayed"]["duplicates_prevented"] == 2

    merged = comparison.report(incident, replayed(incident, agent="recorded", window_ms=15000))["comparison"]
    assert merged["merges"] == {"recorded": [["message-1"], ["message-2"]], "replayed": [["message-1", "message-2"]]}
    assert not merged["same_merges"] and merged["turns"][1]["differences"] == ["turn"]
    # The one merged turn plays both recorded turns: the second pair of calls is caught by the guard.
    assert [c["guard"] for c in merged["turns"][0]["replayed"]["tools"]] == [
        "executed", "executed", "duplicate_prevented", "duplicate_prevented"]
    nothing_left_behind()


def test_a_guarded_tool_that_writes_a_file_is_decided_by_the_guard_but_never_run(settings, tmp_path, incident):
    settings.AGENTLOOP_TOOLS = [*settings.AGENTLOOP_TOOLS, "tests.support.tools_for_tests.WriteNote"]
    note = tmp_path / "note.txt"
    recorded = copy.deepcopy(incident)
    call = {"tool": "write_note", "arguments": {"path": str(note), "text": "booked"}, "guard": "executed"}
    recorded["happened"]["turns"][0]["tools"] = [call]
    recorded["happened"]["turns"][1]["tools"] = [call]

    result = replayed(recorded, agent="recorded")
    assert [t["tools"][0]["guard"] for t in result["happened"]["turns"]] == ["executed", "duplicate_prevented"]
    assert not note.exists(), "a replay ran a tool's real effect"
    assert result["sent"] and not Channel.objects.filter(kind="telegram").exists()
    nothing_left_behind()
    # The same call outside a replay does write it: the test above proves something.
    guard.invoke("write_note", call["arguments"], Scope(key="contact:1"), actor="test")
    assert note.read_text() == "booked"


def test_a_suite_passes_on_the_shipped_recordings_and_fails_loudly_on_an_unmet_expectation(tmp_path, incident, capsys):
    call_command("replay", suite=str(INCIDENT.parent))
    assert "[1/1] incident.json … ok" in capsys.readouterr().out

    (tmp_path / "incident.json").write_text(document.dumps(incident))
    (tmp_path / "expectations.json").write_text(json.dumps({
        "configuration": {"agent": "demo"}, "expect": {"turns_at_most": 1, "no_duplicate_prevented": True}}))
    with pytest.raises(CommandError, match="1 of 1 recording"):
        call_command("replay", suite=str(tmp_path))
    out = capsys.readouterr().out
    assert "incident.json: turns_at_most: expected at most 1 turns, got 2" in out
    assert "no_duplicate_prevented: expected duplicates_prevented = 0, got 2" in out


def test_the_replay_command_writes_the_comparison_as_json(tmp_path):
    out = tmp_path / "report.json"
    call_command("replay", str(INCIDENT), agent="recorded", window_ms=15000, json=str(out))
    report = json.loads(out.read_text())
    assert report["comparison"]["merges"]["replayed"] == [["message-1", "message-2"]]
    assert report["configuration"]["settings"]["window_neutral"] == 15.0


@pytest.mark.parametrize("text, why", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "agentloop-recording", "version": 99}), "recording version 99 is not one this agentloop reads"),
    (json.dumps({"format": "something-else"}), "not an agentloop recording"),
    (json.dumps({"format": "agentloop-recording", "version": 1, "conversation": {}, "settings": {},
                 "events": [{"type": "message", "at_ms": -1, "id": "m"}], "happened": {}}), "at_ms must be"),
])
def test_a_malformed_or_unknown_version_recording_is_refused_with_a_clear_error(tmp_path, text, why):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CommandError, match=why):
        call_command("replay", str(path))


def test_bad_replay_options_and_an_unknown_conversation_are_refused(incident):
    with pytest.raises(CommandError, match="no conversation 424242"):
        call_command("recording", "export", conversation=424242)
    for options, why in (({"agent": "nobody"}, "unknown agent 'nobody'"),
                         ({"double_texting": "shout"}, "double_texting: must be one of"),
                         ({"window_ms": 40000}, "max_wait: shorter than the longest window")):
        with pytest.raises(playback.ReplayError, match=why):
            replayed(incident, **options)
    with pytest.raises(RecordingError, match="unknown expectation"):
        bad = INCIDENT.parent / "nowhere.expect.json"
        try:
            bad.write_text(json.dumps({"expect": {"vibes": True}}))
            suites.read_expectations(bad)
        finally:
            bad.unlink()


def test_an_export_masks_names_ids_and_phone_numbers_on_request(make_channel):
    channel = make_channel("rec", agent="echo")
    base = timezone.now()
    admit(channel, Inbound("m-1", "5691234", "5691234", "Hola, soy Camila: +56 9 1234 5678", sender_name="Camila"),
          base)
    admit(channel, Inbound("m-2", "5691234", "5691234", "mi receta", sender_name="Camila", media_type="photo",
                           media=MediaRef(key="file-abc", ref="ref-abc", kind="photo", file_name="camila-receta.jpg")),
          base + timedelta(seconds=1))
    conversation = Conversation.objects.get()
    exported = recording.export(conversation.pk)
    assert exported["events"][1]["media"]["key"] == "file-abc" and exported["events"][1]["media_type"] == "photo"
    assert exported["events"][0]["text"].startswith("Hola, soy Camila") and exported["conversation"]["id"] == conversation.pk
    masked = recording.export(conversation.pk, mask=True)
    text = json.dumps(masked, ensure_ascii=False)
    assert "Camila" not in text and "5691234" not in text and "1234 5678" not in text and "m-1" not in text
    assert masked["events"][0]["text"] == "Hola, soy person-1: [phone]" and masked["events"][0]["id"] == "message-1"
    assert masked["events"][1]["media"]["key"] == "file-1" and "receta.jpg" not in text
    document.check(masked)
    assert InboundMessage.objects.count() == 2


def test_edits_deletions_and_control_commands_replay_through_intake_and_taps_are_said_skipped(incident):
    recorded = {**incident, "settings": {**incident["settings"], "agent": "echo"}, "happened": {"turns": [], "replies": []}}
    recorded["events"] = [
        {"at_ms": 0, "type": "message", "id": "a", "text": "hola, quiero la hora del lunes y"},
        {"at_ms": 1000, "type": "message", "id": "b", "text": "la del martes"},
        {"at_ms": 1500, "type": "edit", "of": "b", "text": "la del miércoles"},
        {"at_ms": 10000, "type": "message", "id": "c", "text": "y también el jueves y"},
        {"at_ms": 10500, "type": "delete", "of": "c"},
        {"at_ms": 20000, "type": "message", "id": "d", "text": "espera y"},
        {"at_ms": 20500, "type": "message", "id": "e", "text": "/stop"},
        {"at_ms": 30000, "type": "tap", "of": "reply-1", "emoji": "👍"},
        {"at_ms": 40000, "type": "message", "id": "f", "text": "", "media_type": "photo",
         "media": {"key": "file-1", "kind": "photo"}}]
    result = replayed(recorded)
    turn, photo = result["happened"]["turns"]  # the deleted message and the stopped one never make a turn
    assert turn["messages"] == ["a", "b"] and turn["input"] == "hola, quiero la hora del lunes y\nla del miércoles"
    assert (photo["input"], photo["at_ms"]) == ("[photo]", 42500)  # its file not fetched; its type's window kept
    assert result["sent"] == [turn["input"], "Stopped.", "[photo]"]
    assert [r["kind"] for r in result["happened"]["replies"]] == ["reply", "control", "reply"]
    assert result["skipped"] == ["tap at 30000 ms: taps are not replayed"] and result["virtual_ms"] >= 42500


def test_an_export_records_each_message_as_it_first_came_and_its_edit_later(make_channel):
    channel = make_channel("rec", agent="echo")
    start = timezone.now()
    admit(channel, Inbound("m-1", "c1", "c1", "la del martes"), start)
    edits.apply(channel, edits.Edit("m-1", "la del miércoles", start, "api", "c1", "c1"),
                start + timedelta(milliseconds=1500))
    exported = recording.export(Conversation.objects.get().pk)
    assert [(e["type"], e.get("text")) for e in exported["events"]] == [
        ("message", "la del martes"), ("edit", "la del miércoles")]
    assert exported["events"][1]["of"] == "m-1" and exported["events"][1]["at_ms"] >= 0


@pytest.mark.parametrize("rule, turns, sent", [
    ("enqueue", [(["a"], "done", 1200), (["b"], "done", 6200)], ["Nada el lunes.", "Nada el martes."]),
    ("interrupt", [(["a"], "cancelled", 1200), (["b"], "done", 4200)], ["Nada el martes."]),
    ("reject", [(["a"], "done", 1200)], ["I'm still working on your previous message. Please send this again once "
                                         "I've answered.", "Nada el lunes."]),
])
def test_a_message_during_a_running_turn_meets_the_chosen_double_texting_rule(incident, rule, turns, sent):
    """The recorded latency holds the turn open in virtual time: the second message arrives while it runs."""
    recorded = {**incident, "events": [{"at_ms": 0, "type": "message", "id": "a", "text": "¿Qué tengo el lunes?"},
                                       {"at_ms": 3000, "type": "message", "id": "b", "text": "¿Y el martes?"}],
                "happened": {"turns": [{"messages": ["a"], "reply": "Nada el lunes.", "latency_ms": 5000},
                                       {"messages": ["b"], "reply": "Nada el martes.", "latency_ms": 1000}],
                             "replies": []}}
    result = replayed(recorded, agent="recorded", double_texting=rule)
    assert [(t["messages"], t["state"], t["at_ms"]) for t in result["happened"]["turns"]] == turns
    assert result["sent"] == sent


def test_each_declared_expectation_says_what_it_found(incident):
    """Checked against the incident as recorded: two turns 12 s apart, the second's two calls caught."""
    ran = {"happened": incident["happened"]}
    met = {"turns": 2, "turns_at_most": 2, "executed": 2, "duplicates_prevented": 2, "no_tool_executed_twice": True,
           "at_most_one_turn_per_burst": True, "reply_mentions": "psicología", "same_merges_as_recorded": True}
    assert suites.failures(incident, ran, met) == []
    failed = suites.failures(incident, ran, {"no_tool_called_twice": True, "no_duplicate_prevented": True,
                                             "at_most_one_turn_per_burst": 15000, "reply_mentions": "kinesiología"})
    assert [line.split(":")[0] for line in failed] == [
        "no_tool_called_twice", "no_duplicate_prevented", "at_most_one_turn_per_burst", "reply_mentions"]
    assert "a burst answered in more than one turn: [['message-1', 'message-2']]" in failed[2]


def test_the_sandbox_is_a_platform_no_operator_is_offered():
    from conversations import platforms
    from delivery.transports import transport_for

    assert "sandbox" not in dict(platforms.choices()) and "sandbox" not in dict(Channel._meta.get_field("kind").choices)
    assert type(transport_for(Channel(kind="sandbox"))).__name__ == "SandboxTransport"
    assert platforms.get("sandbox").connection() is None and not platforms.get("sandbox").urls()
