"""Erasure reaches every copy of a person's data (issue 51): each copy is made the way
production makes it — Telegram updates posted to a real web server, a real worker
streaming the turns and sending through the local Bot API, a schedule through the API,
the admin's pages — then the person is erased through the operators' API, and the whole
database (SQLite's iterdump, PostgreSQL's pg_dump) and the media folder are read for
their texts, names, ids and file bytes."""

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from conversations import schedules
from conversations.models import Contact, ContextNote, Conversation, Turn, TurnState
from delivery.models import OutboundMessage, OutboundState, ScheduledMessage, ScheduleState, UnreachableChat
from tests.conftest import wait_until
from tests.end_to_end.test_groups import MENTION, group_message, post
from tests.support import local_http
from tests.support.e2e import SECRET, send, telegram_channel, update

pytestmark = pytest.mark.e2e
AGENT = {"AGENTLOOP_EXTRA_AGENTS": "echofile=tests.support.agents_for_tests.EchoFileAgent"}
PERSON, NAME, USERNAME = 77123456, "Zebulon Quarkwright", "zquark"
OTHER = 502
PRIVATE_TEXTS = ["hola, my blood type is AB-", "please send me the file about the dentist on Friday"]
GROUP_TEXT = "I am allergic to penicillin"
SCHEDULED = ["remember your AB- blood test", "your dentist visit is tomorrow"]
NEEDLES = [*PRIVATE_TEXTS, GROUP_TEXT, *SCHEDULED, "blood type", "dentist", "penicillin", NAME, "Zebulon",
           "Quarkwright", USERNAME, str(PERSON)]


def from_person(body):
    body["message"]["from"].update(first_name="Zebulon", last_name="Quarkwright", username=USERNAME)
    return body


def webhook(web, body):
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def settled():
    """Every turn over and every reply finished (delivered, or unreachable)."""
    return (Turn.objects.exists() and not Turn.objects.exclude(state__in=[TurnState.DONE, TurnState.FAILED]).exists()
            and not OutboundMessage.objects.filter(state__in=OutboundMessage.OPEN).exists())


def whole_database() -> str:
    """The database as its own dump tool writes it: every table, every column."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        return "\n".join(connection.connection.iterdump())
    s = connection.settings_dict
    dumped = subprocess.run(
        ["pg_dump", "--data-only", "-h", s["HOST"] or "localhost", "-p", str(s["PORT"] or 5432), "-U", s["USER"],
         s["NAME"]], env={**os.environ, "PGPASSWORD": s["PASSWORD"] or ""}, capture_output=True, text=True,
        timeout=60, check=True)
    return dumped.stdout


def media_bytes(root: Path) -> bytes:
    return b"\n".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def left_in(text: str) -> list[str]:
    return [needle for needle in NEEDLES if needle in text]


def where(text: str) -> str:
    """The dump's lines still holding something of the person (the failure's message)."""
    return "\n".join(line[:300] for line in text.splitlines() if left_in(line))


@pytest.fixture
def copies(processes, make_channel, fake_telegram, agent_key, client, admin_user, tmp_path):
    """Every copy of the person's data, made through the product's doors; returns the web
    server, the media folder and the agent key."""
    channel = telegram_channel(make_channel, fake_telegram, agent="echofile", group_replies="mention", streaming=True,
                               agent_config={"stream_pace": 0.02, "effect_at_word": 1})
    media = tmp_path / "files"
    web = processes.web(wait=False, AGENTLOOP_MEDIA_ROOT=media, **AGENT)
    processes.worker(AGENTLOOP_MEDIA_ROOT=media, **AGENT)
    # A private chat, streamed (the turn acted at its first word: its text so far is kept),
    # one reply carrying a file of the person's words.
    for text in PRIVATE_TEXTS:
        send(web, "tg", PERSON, text, first_name="Zebulon")
        wait_until(lambda: settled() and Turn.objects.filter(merged_input=text).exists(), timeout=30,
                   message=f"the reply to {text!r}")
    webhook(web, from_person(update(PERSON, "hola again", first_name="Zebulon")))
    # A group: the person's line is context, copied into another member's turn.
    post(web, from_person(group_message(PERSON, "Zebulon", GROUP_TEXT)))
    post(web, group_message(OTHER, "Beto", f"{MENTION} what time do you open?"))
    wait_until(lambda: settled() and Turn.objects.filter(conversation__sender_id=str(OTHER)).exists(), timeout=30,
               message="the other member's turn answered")
    # A message that cannot be stored (refused, audited), an edit of one never received.
    webhook(web, from_person(update(PERSON, "a NUL \x00 here", first_name="Zebulon")))
    edit = from_person(update(PERSON, "edited", message_id=999_999, first_name="Zebulon"))
    edit["edited_message"] = {**edit.pop("message"), "edit_date": int(time.time())}
    webhook(web, edit)
    # The admin: a person's limit lifted; their contact saved (its log names them).
    contact = Contact.objects.get(platform_id=str(PERSON))
    client.force_login(admin_user)
    assert client.post("/admin/conversations/contact/", {"action": "lift_limits", "_selected_action": [contact.pk]},
                       ).status_code == 302
    saved = client.post(f"/admin/conversations/contact/{contact.pk}/change/", {
        "channel": channel.pk, "platform_id": str(PERSON), "display_name": NAME, "username": USERNAME,
        "language": "en", "limit_reason": ""})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    # Schedules through the API: one sent already (its note and ledger row), one to come.
    private = Conversation.objects.get(contact=contact, is_group=False)
    key = agent_key(channel)
    for text, due in zip(SCHEDULED, [timezone.now(), timezone.now() + timedelta(hours=1)], strict=True):
        answer = local_http.post(f"{web.url}/api/v1/conversations/{private.pk}/schedules", timeout=10,
                                 headers={"Authorization": f"Bearer {key}"},
                                 json={"text": text, "due_at": due.isoformat(), "repeat_every_seconds": 3600})
        assert answer.status_code == 201, answer.text
    wait_until(lambda: settled() and ContextNote.objects.filter(conversation=private).exists(), timeout=30,
               message="the first schedule's tick sent")
    # The chat blocks the bot: the next reply is refused for good, the chat marked unreachable.
    fake_telegram.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
    send(web, "tg", PERSON, "are you there?", first_name="Zebulon")
    wait_until(lambda: settled() and UnreachableChat.objects.exists(), timeout=30, message="the chat unreachable")
    return web, media, key


def test_erasure_leaves_nothing_of_the_person_in_the_database_or_the_files(copies, admin_user, fake_telegram):
    web, media, _ = copies
    before = whole_database()
    assert left_in(before) == NEEDLES, "every copy was made"
    assert any(needle.encode() in media_bytes(media) for needle in PRIVATE_TEXTS)
    assert Turn.objects.exclude(streamed_text="").filter(conversation__sender_id=str(PERSON)).exists()
    other = Turn.objects.get(conversation__sender_id=str(OTHER))
    assert f"{NAME}: {GROUP_TEXT}" in other.merged_input

    answer = local_http.post(f"{web.url}/api/v1/operator/contacts/forget", auth=("admin", "password"), timeout=60,
                             json={"channel": "tg", "contact": str(PERSON)})
    assert answer.status_code == 200, answer.text

    dump = whole_database()
    assert left_in(dump) == [], where(dump)
    assert left_in(media_bytes(media).decode("utf-8", "replace")) == []
    # The other member keeps their own line and loses the person's, marked.
    other.refresh_from_db()
    lines = other.merged_input.splitlines()
    assert "[erased]" in lines and lines[-1] == f"Beto: {MENTION} what time do you open?"
    # The schedules to the person are cancelled and never fire again.
    assert list(ScheduledMessage.objects.values_list("state", flat=True)) == [ScheduleState.CANCELLED] * 2
    sends = len(fake_telegram.calls("sendMessage"))
    assert schedules.send_due(now=timezone.now() + timedelta(days=2)) == 0
    assert not ContextNote.objects.exists() and not OutboundMessage.objects.filter(
        state=OutboundState.PENDING).exists()
    assert len(fake_telegram.calls("sendMessage")) == sends
