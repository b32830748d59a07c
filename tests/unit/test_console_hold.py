"""Taking a conversation over from the console (conversations.handoff): the story page's
form (take over, reply once however often it is submitted, give back) and the
dashboard socket's take_over / give_back, for operators only."""

import pytest
from django.test import Client

from conversations.ingest import Inbound, admit
from conversations.models import Conversation, ConversationState, Disposition, InboundMessage, Turn
from delivery.models import OutboundMessage
from tests.unit.test_console_websockets import make_user, receive_until, talk

pytestmark = pytest.mark.django_db(transaction=True)

OPERATE = ["view_auditevent", "change_channel", "change_proposal", "change_conversation"]


@pytest.fixture
def chat(make_channel):
    channel = make_channel("shop")
    admit(channel, Inbound(platform_message_id="m1", chat_id="c1", sender_id="c1", text="¿Hay alguien?"))
    return Conversation.objects.get()


def post(client, chat, **data):
    return client.post(f"/console/conversations/{chat.pk}/hold/", data)


def test_the_story_page_takes_over_replies_once_and_gives_back(chat):
    client = Client()
    client.force_login(make_user("op", perms=OPERATE))
    assert post(client, chat, action="take_over").status_code == 302
    chat.refresh_from_db()
    assert chat.state == ConversationState.PERSON and chat.held_by == "console:op"
    assert InboundMessage.objects.get().disposition == Disposition.HELD  # its open buffer closed, no turn
    page = client.get(f"/console/conversations/{chat.pk}/story/")
    assert b"Give back to the agent" in page.content and b'name="key"' in page.content
    for _ in range(2):  # a double submit of the same form
        post(client, chat, action="reply", text="Hola, soy Marta.", key="form-1")
    assert OutboundMessage.objects.filter(text="Hola, soy Marta.").count() == 1
    assert Turn.objects.get().owner == "person:console:op"
    post(client, chat, action="give_back")
    chat.refresh_from_db()
    assert chat.state == ConversationState.AGENT
    assert b"Take over" in client.get(f"/console/conversations/{chat.pk}/story/").content


def test_a_watcher_cannot_take_over(chat):
    client = Client()
    client.force_login(make_user("watcher", perms=["view_auditevent"]))
    assert post(client, chat, action="take_over").status_code == 403
    assert b"Take over" not in client.get(f"/console/conversations/{chat.pk}/story/").content
    chat.refresh_from_db()
    assert chat.state == ConversationState.AGENT


def test_the_dashboard_takes_over_and_gives_back(chat):
    async def body(comm, first):
        await comm.send_json_to({"action": "take_over", "conversation": chat.pk})
        held = await receive_until(comm, lambda m: m["type"] == "held")
        assert held == {"type": "held", "conversation": chat.pk, "action": "take_over", "changed": True}
        await comm.send_json_to({"action": "take_over", "conversation": chat.pk})
        assert (await receive_until(comm, lambda m: m["type"] == "held"))["changed"] is False
        await comm.send_json_to({"action": "give_back", "conversation": chat.pk})
        assert (await receive_until(comm, lambda m: m["type"] == "held"))["changed"] is True
    talk("/ws/console/dashboard/", make_user("op", perms=OPERATE), body)


def test_the_dashboard_refuses_a_watcher(chat):
    async def body(comm, first):
        await comm.send_json_to({"action": "take_over", "conversation": chat.pk})
        error = await receive_until(comm, lambda m: m["type"] == "error")
        assert error["error"] == "your role cannot take conversations over"
    talk("/ws/console/dashboard/", make_user("watcher", perms=["view_auditevent"]), body)
    chat.refresh_from_db()
    assert chat.state == ConversationState.AGENT
