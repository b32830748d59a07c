"""The operator's admin: every Layer 1 page renders with data in it, and edits to a
channel's debounce settings take effect on the next message."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from conversations import engine
from conversations.ingest import Inbound, admit
from conversations.models import Channel, Conversation, InboundMessage, MessageBuffer, Turn

# The channel form's inline of routing rules (conversations.admin_routing), posted empty.
NO_RULES = {"routing_rules-TOTAL_FORMS": "0", "routing_rules-INITIAL_FORMS": "0"}

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = User.objects.create_superuser("operator", "op@example.com", "pw-operator-1")
    client.force_login(user)
    return client


@pytest.fixture
def history(make_channel):
    channel = make_channel("shop")
    admit(channel, Inbound(platform_message_id="1", chat_id="9", sender_id="9", text="¿hola?"))
    admit(channel, Inbound(platform_message_id="2", chat_id="8", sender_id="8", text="hola y"))
    engine.flush_due(now=MessageBuffer.objects.order_by("flush_at").first().flush_at)
    return channel


@pytest.mark.parametrize("model", [Channel, Conversation, InboundMessage, MessageBuffer, Turn])
def test_changelist_and_change_pages_render(operator, history, model):
    app, name = model._meta.app_label, model._meta.model_name
    assert operator.get(reverse(f"admin:{app}_{name}_changelist")).status_code == 200
    obj = model.objects.first()
    assert operator.get(reverse(f"admin:{app}_{name}_change", args=[obj.pk])).status_code == 200


def test_open_buffers_show_seconds_left(operator, history):
    page = operator.get(reverse("admin:conversations_messagebuffer_changelist") + "?state__exact=open")
    assert b"seconds left" in page.content.lower()


def test_debounce_settings_edited_in_the_admin_apply_to_the_next_message(operator, history):
    channel = Channel.objects.get(slug="shop")
    url = reverse("admin:conversations_channel_change", args=[channel.pk])
    form = operator.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None}
    data.update({"window_closed": "0.5", "agent_config": "{}", "double_texting": "reject", **NO_RULES})
    response = operator.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    admission = admit(Channel.objects.get(pk=channel.pk),
                      Inbound(platform_message_id="3", chat_id="7", sender_id="7", text="¿listo?"))
    assert admission.window_seconds == 0.5


def test_routing_rules_are_edited_inline_on_the_channel_and_each_save_is_audited(operator, history):
    from audit.models import AuditEvent, EventKind
    from conversations.models import RoutingRule

    channel = Channel.objects.get(slug="shop")
    url = reverse("admin:conversations_channel_change", args=[channel.pk])
    form = operator.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None} | {"agent_config": "{}"}
    rule = {"routing_rules-TOTAL_FORMS": "1", "routing_rules-INITIAL_FORMS": "0", "routing_rules-0-position": "1",
            "routing_rules-0-name": "sales", "routing_rules-0-keywords": "precio", "routing_rules-0-agent": "echo",
            "routing_rules-0-agent_config": "{}"}
    refused = operator.post(url, data | rule | {"routing_rules-0-agent": "pull"})
    assert refused.status_code == 200 and "not a rule" in refused.content.decode()
    assert operator.post(url, data | rule).status_code == 302
    assert list(RoutingRule.objects.values_list("name", "keywords", "agent")) == [("sales", "precio", "echo")]
    [event] = AuditEvent.objects.filter(kind=EventKind.ROUTING_CHANGED)
    assert event.summary == "+sales" and event.actor.startswith("admin:") and event.channel_slug == "shop"
