"""The admin's people-in-control actions (conversations.admin_people): take a
conversation over and give it back, see who is over a limit and lift it."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.ingest import Inbound, admit
from conversations.models import Contact, ContextNote, Conversation, ConversationState

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("operator", "op@example.com", "pw-operator-1"))
    return client


@pytest.fixture
def chat(make_channel):
    admit(make_channel("shop"), Inbound(platform_message_id="m1", chat_id="c1", sender_id="c1", text="Hola"))
    return Conversation.objects.get()


def act(client, url, action, pk):
    return client.post(url, {"action": action, "_selected_action": [pk]})


def test_take_over_and_give_back_from_the_admin(operator, chat):
    url = "/admin/conversations/conversation/"
    assert act(operator, url, "take_over", chat.pk).status_code == 302
    chat.refresh_from_db()
    assert chat.state == ConversationState.PERSON and chat.held_by == "admin:operator"
    assert b"person" in operator.get(f"{url}?state__exact=person").content
    act(operator, url, "give_back", chat.pk)
    chat.refresh_from_db()
    assert chat.state == ConversationState.AGENT
    assert "admin:operator" in ContextNote.objects.get().text


def test_who_is_over_a_limit_and_lifting_it(operator, chat):
    Contact.objects.update(limited_until=timezone.now() + timedelta(minutes=40), limit_reason="2 turns per hour")
    url = "/admin/conversations/contact/"
    page = operator.get(f"{url}?limited=now").content.decode()
    assert "2 turns per hour" in page
    act(operator, url, "lift_limits", chat.contact_id)
    contact = Contact.objects.get()
    assert contact.limited_until is None and contact.limits_counted_from is not None
    assert AuditEvent.objects.filter(kind=EventKind.LIMIT_LIFTED, actor="admin:operator").exists()
