"""Edits that count (issue 14 §2): Telegram's edited_message (the Django view, the lean
ASGI path, long polling), the inbound API's PATCH, and what an edit does to an open
buffer, a turn that may be re-run, and a turn that fired an effect. Time is injected
where windows matter; the end-to-end test runs the real web server and worker."""

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.db import connection

from audit.models import AuditEvent, EventKind
from conversations import edits, engine, flushing, lean_ingest, platforms, turns
from conversations.edits import Edit
from conversations.ingest import Inbound, Unstorable, admit
from conversations.lean_ingest import LeanIngest
from conversations.models import (
    BufferState,
    Channel,
    ContextNote,
    EditOutcome,
    InboundMessage,
    MessageBuffer,
    MessageEdit,
    Turn,
    TurnState,
)
from conversations.platforms.connection import admit_received
from tests.conftest import wait_until
from tests.support import local_http

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SECRET = "edit-secret"
HEADER = "X-Telegram-Bot-Api-Secret-Token"


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def msg(mid, text, chat="100"):
    return Inbound(platform_message_id=str(mid), chat_id=chat, sender_id=chat, text=text, reply_target=str(mid))


def edit(mid, text, seconds=1.0, chat="100", source="api"):
    return Edit(platform_message_id=str(mid), text=text, edited_at=at(seconds), source=source, chat_id=chat,
                sender_id=chat)


@pytest.fixture
def channel(make_channel):
    return make_channel("chan")


def set_strategy(channel, strategy):
    channel.double_texting = strategy
    channel.save()


def running_turn(channel, text="Agéndame psicología el martes.", effect=False):
    admit(channel, msg(1, text), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    assert turns.start(turn.pk, "w1", now=at(2))
    if effect:
        assert turns.mark_effect(turn.pk)
    return turn


# --- an edit of a message still waiting in its open buffer ------------------------------------


@pytest.mark.django_db
def test_an_edit_in_the_open_buffer_replaces_the_text_and_rearms_the_window(channel):
    admit(channel, msg(1, "Confirmo las horas y"), now=at(0))
    admit(channel, msg(2, "también la de kine y"), now=at(1))  # open: 4 s
    result = edits.apply(channel, edit(2, "también la de kine."), now=at(2))
    assert result.outcome == EditOutcome.BUFFERED and not result.duplicate
    buffer = MessageBuffer.objects.get()
    # Re-armed from the edit, classified by the edited (last) text: closed, 1.2 s.
    assert (buffer.window_kind, buffer.flush_at, buffer.message_count) == ("closed", at(3.2), 2)
    assert flushing.flush_due(now=at(3.1)) == []
    [turn] = flushing.flush_due(now=at(3.2))
    assert turn.merged_input == "Confirmo las horas y\ntambién la de kine."
    message = InboundMessage.objects.get(platform_message_id="2")
    assert message.text == "también la de kine." and message.edited_at == at(2)
    row = MessageEdit.objects.get()
    assert (row.old_text, row.new_text, row.outcome) == ("también la de kine y", "también la de kine.", "buffered")
    assert AuditEvent.objects.get(kind=EventKind.MESSAGE_EDITED).target == f"message {message.pk}"


@pytest.mark.django_db
def test_an_edit_of_an_earlier_message_rearms_by_the_last_one(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    admit(channel, msg(2, "una consulta sobre la cita y"), now=at(1))
    edits.apply(channel, edit(1, "buenas"), now=at(3))
    buffer = MessageBuffer.objects.get()
    assert (buffer.window_kind, buffer.flush_at) == ("open", at(7))  # by message 2, from now
    [turn] = flushing.flush_due(now=at(7))
    assert turn.merged_input == "buenas\nuna consulta sobre la cita y"


# --- an edit of a message already merged into a turn --------------------------------------------


@pytest.mark.django_db
def test_interrupt_without_an_effect_cancels_the_turn_and_reruns_it_corrected(channel):
    set_strategy(channel, "interrupt")
    turn = running_turn(channel)
    result = edits.apply(channel, edit(1, "Agéndame psicología el miércoles."), now=at(3))
    assert (result.outcome, result.turn_id) == (EditOutcome.RERUN, turn.pk)
    turn.refresh_from_db()
    assert turn.state == TurnState.CANCELLED and "edited" in turn.outcome
    [rerun] = flushing.flush_due(now=at(3))  # due at once
    assert rerun.merged_input == "Agéndame psicología el miércoles."
    assert (rerun.flush_reason, rerun.reply_target) == ("edit", "1")
    assert not ContextNote.objects.exists()


@pytest.mark.django_db
def test_a_rerun_joins_messages_already_waiting(channel):
    """A ready turn (not started yet) and a newer message waiting in the open buffer:
    the re-run takes both, in the order they were sent."""
    set_strategy(channel, "interrupt")
    admit(channel, msg(1, "Agéndame psicología el martes."), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    admit(channel, msg(2, "a las 10."), now=at(3))
    assert edits.apply(channel, edit(1, "Agéndame psicología el miércoles."), now=at(4)).outcome == "rerun"
    assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED
    [rerun] = flushing.flush_due(now=at(5.2))
    assert rerun.merged_input == "Agéndame psicología el miércoles.\na las 10."


@pytest.mark.django_db
def test_an_edit_of_input_an_interrupt_carried_into_the_open_buffer_corrects_it_there(channel):
    set_strategy(channel, "interrupt")
    turn = running_turn(channel, "Confirmo las horas.")
    admit(channel, msg(2, "Agéndame las horas."), now=at(3))  # interrupts: carried into a new buffer
    assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED
    result = edits.apply(channel, edit(1, "Confirmo las dos horas."), now=at(4))
    assert result.outcome == EditOutcome.BUFFERED
    [next_turn] = flushing.flush_due(now=at(5.2))
    assert next_turn.merged_input == "Confirmo las dos horas.\nAgéndame las horas."


@pytest.mark.django_db
def test_after_an_effect_fired_the_edit_is_a_note_for_the_next_turn_and_nothing_reruns(channel):
    set_strategy(channel, "interrupt")
    turn = running_turn(channel, effect=True)
    result = edits.apply(channel, edit(1, "Agéndame psicología el miércoles."), now=at(3))
    assert (result.outcome, result.turn_id) == (EditOutcome.NOTED, turn.pk)
    assert "fired an external effect" in result.detail
    assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
    assert not MessageBuffer.objects.filter(state=BufferState.OPEN).exists()
    note = ContextNote.objects.get()
    assert note.text == ('The user edited an earlier message from "Agéndame psicología el martes." '
                         'to "Agéndame psicología el miércoles.".')
    # The agent reads it in the next turn.
    turns.finish(turn.pk, "w1", state=TurnState.DONE, reply_text="Agendado el martes.")
    admit(channel, msg(2, "¿Quedó?"), now=at(10))
    [later] = flushing.flush_due(now=at(12))
    history = engine.conversation_history(later.conversation, later)
    assert {"role": "system", "content": note.text} in history


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["enqueue", "reject", "rollback"])
def test_other_strategies_note_the_edit(channel, strategy):
    set_strategy(channel, strategy)
    turn = running_turn(channel)
    result = edits.apply(channel, edit(1, "Agéndame psicología el miércoles."), now=at(3))
    assert result.outcome == EditOutcome.NOTED and strategy in result.detail
    assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
    assert ContextNote.objects.count() == 1


@pytest.mark.django_db
def test_an_edit_after_the_turn_is_done_is_noted_even_with_interrupt(channel):
    set_strategy(channel, "interrupt")
    turn = running_turn(channel)
    turns.finish(turn.pk, "w1", state=TurnState.DONE, reply_text="ok")
    assert edits.apply(channel, edit(1, "otra cosa"), now=at(9)).outcome == EditOutcome.NOTED
    assert not MessageBuffer.objects.filter(state=BufferState.OPEN).exists()


# --- ignore, duplicates, bad input ---------------------------------------------------------------


@pytest.mark.django_db
def test_with_edits_ignored_an_edit_is_recorded_and_changes_nothing(channel):
    channel.edits = "ignore"
    channel.save()
    admit(channel, msg(1, "Confirmo las horas y"), now=at(0))
    before = MessageBuffer.objects.get()
    result = edits.apply(channel, edit(1, "Confirmo las horas."), now=at(1))
    assert result.outcome == EditOutcome.IGNORED
    assert InboundMessage.objects.get().text == "Confirmo las horas y"
    assert MessageBuffer.objects.get().flush_at == before.flush_at
    assert AuditEvent.objects.get(kind=EventKind.EDIT_IGNORED).extra["outcome"] == "ignored"


@pytest.mark.django_db
def test_a_redelivered_edit_changes_nothing_the_second_time(channel):
    set_strategy(channel, "interrupt")
    running_turn(channel, effect=True)
    first = edits.apply(channel, edit(1, "miércoles"), now=at(3))
    again = edits.apply(channel, edit(1, "miércoles"), now=at(4))
    assert (again.duplicate, again.outcome, again.turn_id) == (True, first.outcome, first.turn_id)
    assert MessageEdit.objects.count() == 1 and ContextNote.objects.count() == 1
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_EDITED).count() == 1
    # A later edit (another edit_date) counts again.
    assert not edits.apply(channel, edit(1, "jueves", seconds=5), now=at(5)).duplicate


@pytest.mark.django_db
def test_unknown_messages_other_senders_and_commands(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    admit(channel, msg(2, "/help"), now=at(0))
    assert edits.apply(channel, edit(99, "x", 1)).outcome == edits.UNKNOWN
    assert edits.apply(channel, edit(1, "x", 1, chat="200")).outcome == edits.UNKNOWN  # not its sender
    assert AuditEvent.objects.filter(kind=EventKind.EDIT_IGNORED).count() == 2
    result = edits.apply(channel, edit(2, "/stop", 1))
    assert result.outcome == EditOutcome.NOT_APPLIED and "control command" in result.detail
    assert edits.apply(channel, edit(1, "hola", 2)).outcome == EditOutcome.UNCHANGED
    assert InboundMessage.objects.get(platform_message_id="1").text == "hola"


@pytest.mark.django_db
def test_an_oversized_or_unstorable_edit_is_refused_like_a_message(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    with pytest.raises(Unstorable, match="at most 20000"):
        edits.apply(channel, edit(1, "x" * 20001, 1))
    with pytest.raises(Unstorable, match="NUL"):
        edits.apply(channel, edit(1, "a\x00b", 1))
    assert not MessageEdit.objects.exists() and InboundMessage.objects.get().text == "hola"


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_edits_apply_once(channel):
    """Eight threads deliver the same edit at once (on PostgreSQL they really race; the
    conversation lock and the unique (message, edited_at) decide)."""
    set_strategy(channel, "interrupt")
    running_turn(channel, effect=True)
    results, barrier = [], threading.Barrier(8)

    def deliver():
        try:
            barrier.wait()
            results.append(edits.apply(channel, edit(1, "miércoles", 3)))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.duplicate for r in results) == [False] + [True] * 7
    assert MessageEdit.objects.count() == 1 and ContextNote.objects.count() == 1


# --- Telegram: the view, the lean path, long polling ---------------------------------------------


def tg_update(update_id, text, *, message_id=3051, chat=52093311, edit_date=None):
    message = {"message_id": message_id, "date": 1796040000, "text": text,
               "from": {"id": chat, "is_bot": False, "first_name": "Camila"},
               "chat": {"id": chat, "type": "private", "first_name": "Camila"}}
    if edit_date is None:
        return {"update_id": update_id, "message": message}
    return {"update_id": update_id, "edited_message": {**message, "edit_date": edit_date}}


def post_view(client, body):
    return client.post("/webhooks/telegram/tg/", data=json.dumps(body), content_type="application/json",
                       HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=SECRET)


@pytest.fixture
def tg(make_channel):
    return make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:A", "webhook_secret": SECRET})


@pytest.mark.django_db
def test_the_webhook_view_applies_an_edited_message_once(client, tg):
    assert post_view(client, tg_update(1, "Confirmo las horas y")).json() == {"ok": True, "duplicate": False}
    edited = tg_update(2, "Confirmo las horas.", edit_date=1796040030)
    assert post_view(client, edited).json() == {"ok": True, "duplicate": False, "edit": "buffered"}
    assert post_view(client, edited).json() == {"ok": True, "duplicate": True, "edit": "buffered"}
    assert InboundMessage.objects.get().text == "Confirmo las horas."
    row = MessageEdit.objects.get()
    assert (row.source, row.edited_at) == ("telegram", datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC))
    assert MessageBuffer.objects.get().window_kind == "closed"


@pytest.mark.django_db
def test_the_webhook_answers_200_to_an_edit_it_cannot_apply(client, tg):
    unknown = post_view(client, tg_update(1, "x", message_id=7, edit_date=1796040030))
    assert unknown.status_code == 200 and unknown.json() == {"ok": True, "ignored": True, "edit": "unknown_message"}
    assert AuditEvent.objects.get(kind=EventKind.EDIT_IGNORED).target == "message 52093311:7"
    post_view(client, tg_update(2, "hola"))
    oversized = post_view(client, tg_update(3, "x" * 20001, edit_date=1796040030))
    assert oversized.status_code == 200 and "at most 20000" in oversized.json()["refused"]
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_REFUSED).count() == 1
    assert InboundMessage.objects.get().text == "hola"


def post_lean(app, bodies):
    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            return await asyncio.gather(*(http.post("/webhooks/telegram/tg/", content=json.dumps(b),
                                                    headers={HEADER: SECRET}) for b in bodies))

    return asyncio.run(run())


async def _django_must_not_answer(scope, receive, send):
    raise AssertionError("the lean path handed a webhook POST to Django")


@pytest.mark.django_db(transaction=True)
def test_the_lean_path_applies_edits_after_the_messages_of_its_batch(monkeypatch):
    # One admitter (PostgreSQL runs two): with two, the edit could be taken by the other
    # one while the message's batch is still uncommitted, and find no message to edit.
    monkeypatch.setattr(lean_ingest, "POSTGRES_ADMITTERS", 1)
    Channel.objects.create(slug="tg", kind="telegram", platform_settings={"bot_token": "1:A", "webhook_secret": SECRET})
    Channel.objects.forget_cached()
    app = LeanIngest(_django_must_not_answer)
    try:
        # The message and its edit in one batch: the edit is applied after the commit.
        answers = post_lean(app, [tg_update(1, "hola y"), tg_update(2, "hola, una consulta.", edit_date=1796040030)])
        assert [a.json() for a in answers] == [{"ok": True, "duplicate": False},
                                               {"ok": True, "duplicate": False, "edit": "buffered"}]
        [again] = post_lean(app, [tg_update(2, "hola, una consulta.", edit_date=1796040030)])
        assert again.json() == {"ok": True, "duplicate": True, "edit": "buffered"}
    finally:
        app.admitter.stop()
    assert InboundMessage.objects.get().text == "hola, una consulta."
    assert MessageEdit.objects.count() == 1


@pytest.mark.django_db
def test_long_polling_applies_edits_in_update_order(tg):
    Channel.objects.filter(pk=tg.pk).update(platform_settings={**tg.platform_settings, "mode": "polling"},
                                             poll_owner="w1")
    batch = [tg_update(10, "Confirmo las horas y"), tg_update(11, "Confirmo las horas.", edit_date=1796040030),
             tg_update(12, "x", message_id=999, edit_date=1796040031)]
    polling = platforms.get("telegram").connection()  # what the poller does with a batch and its next offset
    assert admit_received(polling, tg.pk, "w1", batch, 13) == 2  # the message, and the edit that re-armed its buffer
    assert admit_received(polling, tg.pk, "w1", batch, 13) == 0  # re-polled: both are duplicates
    assert InboundMessage.objects.get().text == "Confirmo las horas."
    assert MessageEdit.objects.count() == 1
    assert Channel.objects.get(pk=tg.pk).poll_offset == 13
    assert AuditEvent.objects.filter(kind=EventKind.EDIT_IGNORED, target="message 52093311:999").exists()


# --- the inbound API's PATCH ---------------------------------------------------------------------

URL = "/api/v1/channels/{}/messages/{}"


@pytest.fixture
def shop(make_channel):
    return make_channel("shop", kind="api", double_texting="interrupt")


def patch(client, key, message_id, body, slug="shop"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return client.patch(URL.format(slug, message_id), data=json.dumps(body), content_type="application/json",
                        **headers)


def post_message(client, key, message_id, text):
    response = client.post("/api/v1/channels/shop/messages", data={"message_id": message_id, "contact": "ana",
                                                                     "text": text},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 202, response.content


@pytest.mark.django_db
def test_api_patch_applies_an_edit_and_a_retry_with_its_time_is_a_duplicate(client, shop, agent_key):
    key = agent_key(shop)
    post_message(client, key, "m1", "Confirmo las horas y")
    body = {"text": "Confirmo las horas.", "edited_at": "2026-11-30T12:00:30Z"}
    response = patch(client, key, "m1", body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["outcome"], data["duplicate"], data["turn"]) == ("buffered", False, None)
    assert data["flush_at"] and data["message"] == InboundMessage.objects.get().pk
    assert patch(client, key, "m1", body).json()["duplicate"] is True
    assert InboundMessage.objects.get().text == "Confirmo las horas."


@pytest.mark.django_db
def test_api_patch_reruns_a_turn_without_effects(client, shop, agent_key):
    key = agent_key(shop)
    post_message(client, key, "m1", "Agéndame el martes.")
    [turn] = flushing.flush_due(now=at(10**6))
    turns.start(turn.pk, "w1")
    data = patch(client, key, "m1", {"text": "Agéndame el miércoles."}).json()
    assert (data["outcome"], data["turn"]) == ("rerun", turn.pk)
    [rerun] = flushing.flush_due()
    assert rerun.merged_input == "Agéndame el miércoles."


@pytest.mark.django_db
def test_api_patch_errors(client, shop, make_channel, agent_key):
    key = agent_key(shop)
    other_key = agent_key(make_channel("other", kind="api"))
    post_message(client, key, "m1", "hola")
    cases = [
        (None, "m1", {"text": "x"}, (401, 403)),
        ("nope", "m1", {"text": "x"}, (401, 403)),
        (other_key, "m1", {"text": "x"}, (403,)),
        (key, "m9", {"text": "x"}, (404,)),
        (key, "m1", {}, (400,)),
        (key, "m1", {"text": 5, "edited_at": "yesterday"}, (400,)),
        (key, "m1", {"text": "x" * 20001}, (400,)),
        (key, "m1", {"text": "a\x00b"}, (400,)),
    ]
    for k, message_id, body, statuses in cases:
        response = patch(client, k, message_id, body)
        assert response.status_code in statuses, (message_id, body, response.content)
        assert "error" in response.json()
    assert InboundMessage.objects.get().text == "hola" and not MessageEdit.objects.exists()


@pytest.mark.django_db
def test_api_patch_on_a_channel_that_ignores_edits_is_409_and_recorded(client, shop, agent_key):
    key = agent_key(shop)
    post_message(client, key, "m1", "hola")
    Channel.objects.filter(pk=shop.pk).update(edits="ignore")
    Channel.objects.forget_cached()
    response = patch(client, key, "m1", {"text": "buenas"})
    assert response.status_code == 409 and "ignores edits" in response.json()["error"]
    assert MessageEdit.objects.get().outcome == "ignored"
    assert InboundMessage.objects.get().text == "hola"


@pytest.mark.django_db
def test_the_schema_documents_the_patch_and_its_errors(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/channels/{slug}/messages/{message_id}"]["patch"]
    assert {"200", "400", "404", "409"} <= set(operation["responses"])
    assert "ignores edits" in operation["description"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert schema["components"]["schemas"][body]["required"] == ["text"]


# --- end to end: the real web server and worker ---------------------------------------------------


@pytest.mark.e2e
def test_an_edit_reruns_the_running_turn_and_only_the_corrected_reply_goes_out(processes, make_channel,
                                                                                fake_telegram):
    from tests.support.e2e import send, telegram_channel, update

    telegram_channel(make_channel, fake_telegram, double_texting="interrupt", agent_config={"delay": 3.0})
    web, _ = processes.web(wait=False), processes.worker()
    sent = send(web, "tg", 101, "Agéndame psicología el martes.")
    first = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).first(), message="turn running")
    edited = update(101, "Agéndame psicología el miércoles.", message_id=sent["message"]["message_id"])
    edited["edited_message"] = {**edited.pop("message"), "edit_date": sent["message"]["date"] + 1}
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=edited, headers={HEADER: "e2e-secret"})
    assert response.json() == {"ok": True, "duplicate": False, "edit": "rerun"}
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    assert reply.params["text"] == "Agéndame psicología el miércoles."
    first.refresh_from_db()
    assert first.state == TurnState.CANCELLED
    wait_until(lambda: Turn.objects.filter(state=TurnState.DONE).count() == 1, message="re-run done")
    assert len(fake_telegram.calls("sendMessage")) == 1


# --- the playground's edit (its websocket, as the page sends it) -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_playground_edits_the_persons_own_message_only():
    from tests.unit.test_console_websockets import OPERATE, make_user, receive_until, talk

    Channel.objects.create(slug="playground", kind="webchat", agent="demo", window_closed=2.0)
    owner, other = make_user("op", perms=OPERATE), make_user("op2", perms=OPERATE)

    async def body(comm, hello):
        await comm.send_json_to({"text": "quiero una cita y", "id": "a1"})
        await receive_until(comm, lambda m: m["type"] == "admitted")
        await comm.send_json_to({"edit": "a1", "text": "quiero una cita."})
        edited = await receive_until(comm, lambda m: m["type"] == "edited")
        assert (edited["outcome"], edited["window_kind"], edited["window_seconds"]) == ("buffered", "closed", 2.0)
        assert edited["flush_at"] > edited["now"] and edited["text"] == "quiero una cita."
        await comm.send_json_to({"edit": "a1", "text": "x" * 4001})
        assert (await receive_until(comm, lambda m: m["type"] == "error"))["error"].startswith("messages are limited")
    talk("/ws/console/playground/playground/", owner, body)

    async def reconnect(comm, hello):
        [mine] = hello["transcript"]
        assert (mine["id"], mine["edited"], mine["text"]) == ("console:a1", True, "quiero una cita.")
    talk("/ws/console/playground/playground/", owner, reconnect)

    async def someone_else(comm, hello):
        await comm.send_json_to({"edit": "a1", "text": "hackeado."})
        assert (await receive_until(comm, lambda m: m["type"] == "edited"))["outcome"] == "unknown_message"
    talk("/ws/console/playground/playground/", other, someone_else)
    assert InboundMessage.objects.get().text == "quiero una cita."


@pytest.mark.django_db
def test_the_story_page_shows_each_edit_with_the_text_before_it(channel):
    from agentloop.console import story

    set_strategy(channel, "interrupt")
    turn = running_turn(channel)
    edits.apply(channel, edit(1, "Agéndame psicología el miércoles."), now=at(3))
    page = story.page(turn.conversation_id)
    [entry] = [e for e in page.entries if e.kind == "edit"]
    shown = story.as_dict(entry)
    assert shown["title"].endswith("Turn cancelled and re-run with the corrected text")
    assert shown["text"] == "Agéndame psicología el miércoles."
    assert {"label": "Text before", "value": "Agéndame psicología el martes."} in shown["details"]
    assert [link["label"] for link in shown["links"]] == [f"message {InboundMessage.objects.get().pk}",
                                                          f"turn {turn.pk}"]
    [message] = [e for e in page.entries if e.kind == "message"]
    assert any(label == "Edited" for label, _ in message.details)


@pytest.mark.e2e
def test_the_playground_edit_in_a_browser_corrects_the_turn_and_shows_on_the_dashboard(processes, browser):
    from django.contrib.auth.models import User

    from tests.support.browser import assert_no_console_errors, page_for

    Channel.objects.create(slug="playground", kind="webchat", agent="echo",
                           **{f"window_{kind}": 3.0 for kind in ("closed", "greeting", "open", "neutral")})
    User.objects.create_superuser("op", "op@example.com", "pw-op-edits-1")
    web = processes.web(wait=False)
    processes.worker()
    page = page_for(browser, web.url, "op", "pw-op-edits-1")
    dashboard = page.context.new_page()
    dashboard.goto("/console/")
    dashboard.wait_for_selector("#connection.pill-ok")
    page.goto("/console/playground/")
    page.wait_for_selector("#connection.pill-ok")
    chat = page.locator("#chat-input")
    chat.fill("quiero una cita el martes y")
    chat.press("Enter")
    page.locator(".bubble-me .bubble-edit").click()
    assert chat.input_value() == "quiero una cita el martes y"
    assert page.locator("#chat-form button[type=submit]").inner_text() == "Save edit"
    chat.fill("quiero una cita el jueves.")
    chat.press("Enter")
    page.locator(".system-merge", has_text="Edit applied").wait_for()
    assert page.locator(".bubble-me .text").inner_text() == "quiero una cita el jueves."
    assert page.locator(".bubble-me .edited").count() == 1
    # The echo agent answers with the merged turn: the corrected text only.
    page.locator(".bubble-agent", has_text="quiero una cita el jueves.").wait_for(timeout=15_000)
    assert page.locator(".bubble-agent").count() == 1
    dashboard.locator("#feed li", has_text="Message edited by the user").wait_for()
    assert_no_console_errors(page)
    assert_no_console_errors(dashboard)
