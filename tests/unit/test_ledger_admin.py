"""The ledger in the operator's admin: rows filterable by state, channel and age;
"retry now" and "abandon"; per channel: the last error and the unreachable chats."""

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
from delivery.transports import SendResult
from tests.support.e2e import UNPACED

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("olga", "olga@example.com", "pw-olga-1"))
    return client


@pytest.fixture
def rows(make_channel, make_conversation):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:T", **UNPACED})
    blocked = ledger.enqueue(make_conversation(channel, "101"), "hola", kind=OutboundKind.REPLY)
    waiting = ledger.enqueue(make_conversation(channel, "202"), "¿sigue?", kind=OutboundKind.REPLY)
    [claimed] = ledger.claim_many([blocked.pk], "w1")
    ledger.finish(claimed, "w1", SendResult.failed(Outcome.PERMANENT, "Forbidden: bot was blocked by the user"))
    return channel, blocked, waiting


def test_rows_filterable_by_state_channel_and_age(operator, rows):
    channel, blocked, waiting = rows
    url = reverse("admin:delivery_outboundmessage_changelist")
    for query in ("", "?state=unreachable", f"?channel__id__exact={channel.pk}", "?age=1h", "?age=stale"):
        assert operator.get(url + query).status_code == 200, query
    page = operator.get(url + "?state=unreachable").content.decode()
    assert "hola" in page and "¿sigue?" not in page
    assert "hola" not in operator.get(url + "?age=stale").content.decode()
    detail = operator.get(reverse("admin:delivery_outboundmessage_change", args=[blocked.pk])).content.decode()
    assert "bot was blocked" in detail and 'name="_save"' not in detail  # history is read-only


def test_retry_now_and_abandon_actions(operator, rows):
    _, blocked, waiting = rows
    url = reverse("admin:delivery_outboundmessage_changelist")
    operator.post(url, {"action": "retry_now", "_selected_action": [blocked.pk]})
    operator.post(url, {"action": "abandon", "_selected_action": [waiting.pk]})
    states = dict(OutboundMessage.objects.values_list("pk", "state"))
    assert states == {blocked.pk: OutboundState.FAILED, waiting.pk: OutboundState.ABANDONED}
    [again] = ledger.claim_due("w2")
    assert again.pk == blocked.pk and again.needs_marker


def test_the_channel_page_shows_the_last_error_and_unreachable_chats(operator, rows):
    channel, *_ = rows
    page = operator.get(reverse("admin:conversations_channel_change", args=[channel.pk])).content.decode()
    assert "Last error:" in page and "bot was blocked by the user" in page
    assert "Unreachable chats" in page and "<li>101" in page
    assert operator.get(reverse("admin:delivery_unreachablechat_changelist")).status_code == 200


def test_the_ledger_list_cuts_a_long_reply_and_links_the_whole(operator, make_channel, make_conversation):
    text = "palabra " * 1250
    row = ledger.enqueue(make_conversation(make_channel("api"), "303"), text, kind=OutboundKind.REPLY)
    page = operator.get(reverse("admin:delivery_outboundmessage_changelist")).content.decode()
    assert text[:40] in page and text[:2000] not in page
    assert f'<a class="al-cell" href="{reverse("admin:delivery_outboundmessage_change", args=[row.pk])}"' in page
    header = page[page.index("<thead"):page.index("</thead>")]
    assert len(re.findall(r"<th[ >]", header)) <= 8  # the checkbox and at most seven columns
    assert text.strip() in operator.get(reverse("admin:delivery_outboundmessage_change", args=[row.pk])).content.decode()


def test_a_count_of_failures_is_painted_only_when_there_are_some(operator, rows):
    from delivery.models import UnreachableChat

    url = reverse("admin:delivery_unreachablechat_changelist")
    UnreachableChat.objects.update(failures=0)
    calm = operator.get(url).content.decode()
    assert '<span class="al-count">0</span>' in calm and "al-danger" not in calm
    UnreachableChat.objects.update(failures=3)
    assert '<span class="al-count al-danger">3</span>' in operator.get(url).content.decode()


def test_a_scheduled_message_is_due_in_words(operator, make_channel, make_conversation):
    from datetime import timedelta

    from django.utils import timezone

    from conversations import schedules

    schedules.schedule(make_conversation(make_channel("api"), "404"), "¿vienes mañana?",
                       timezone.now() + timedelta(days=1))
    url = reverse("admin:delivery_scheduledmessage_changelist")
    assert "in 1\xa0day" in operator.get(url).content.decode()
    assert "1\xa0día" in operator.get(url, HTTP_ACCEPT_LANGUAGE="es").content.decode()
