"""The operator's admin: every Layer 1 page renders with data in it, and edits to a
channel's debounce settings take effect on the next message."""

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from conversations import flushing
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
    flushing.flush_due(now=MessageBuffer.objects.order_by("flush_at").first().flush_at)
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


LONG = ("palabra " * 1250)[:10_000]  # a 10,000-character message
SOLID = "x" * 10_000  # one with no space to wrap at


@pytest.fixture
def long_history(make_channel):
    channel = make_channel("long")
    admit(channel, Inbound(platform_message_id="1", chat_id="9", sender_id="9", text=LONG, sender_name="x" * 200))
    flushing.flush_due(now=MessageBuffer.objects.get().flush_at)
    Turn.objects.update(reply_text=SOLID)
    return Conversation.objects.get()


def test_a_long_message_is_cut_in_lists_with_the_whole_one_click_away(operator, long_history):
    turn, message = Turn.objects.get(), InboundMessage.objects.get()
    turns = operator.get(reverse("admin:conversations_turn_changelist")).content.decode()
    assert LONG[:40] in turns and LONG[:2000] not in turns and SOLID[:100] not in turns
    assert f'<a class="al-cell" href="{reverse("admin:conversations_turn_change", args=[turn.pk])}"' in turns
    messages = operator.get(reverse("admin:conversations_inboundmessage_changelist")).content.decode()
    assert f'href="{reverse("admin:conversations_inboundmessage_change", args=[message.pk])}"' in messages
    assert LONG[:2000] not in messages
    # The whole text on the row's page, wrapped by texts.css.
    page = operator.get(reverse("admin:conversations_inboundmessage_change", args=[message.pk])).content.decode()
    assert LONG.strip() in page and "admin_texts/texts.css" in page


def test_the_turns_inline_shows_the_start_and_the_whole_behind_a_toggle(operator, long_history):
    page = operator.get(reverse("admin:conversations_conversation_change", args=[long_history.pk])).content.decode()
    toggle = page[page.index('<details class="al-toggle">'):]
    summary = toggle[:toggle.index("</summary>")]
    assert len(summary) < 300 and summary.endswith("…")  # the start, one line
    assert SOLID in page and "admin_texts/texts.css" in page  # the whole, behind it
    # A contact named with 200 characters is cut wherever it names them.
    assert "x" * 61 not in page.split("<details")[0]


@pytest.mark.parametrize("model", [Turn, InboundMessage, MessageBuffer])
def test_a_row_written_by_the_worker_offers_no_save(operator, long_history, model):
    obj = model.objects.first()
    url = reverse(f"admin:conversations_{model._meta.model_name}_change", args=[obj.pk])
    page = operator.get(url).content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert operator.post(url, {}).status_code == 403  # not by hand either


def test_a_turn_list_shows_what_an_operator_scans(operator, long_history):
    Turn.objects.update(state="failed")
    page = operator.get(reverse("admin:conversations_turn_changelist")).content.decode()
    header = page[page.index("<thead"):page.index("</thead>")]
    assert len(re.findall(r"<th[ >]", header)) <= 8  # the checkbox and at most seven columns
    assert "bg-red-100" in page  # a failed turn stands out as a label


def test_states_read_as_their_labels_in_the_operators_language(operator, long_history):
    Turn.objects.update(state="done")
    url = reverse("admin:conversations_conversation_changelist")
    page = operator.get(url).content.decode()
    assert "The agent answers" in page and "Done" in page
    spanish = operator.get(url, HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "Responde el agente" in spanish and not re.search(r">\s*(agent|done)\s*<", spanish)
