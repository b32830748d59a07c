"""The Limits page (conversations.admin_limits, issue 53): every limit in one admin page —
each channel's limits per person (and those that set none), the people over a limit now
with when it resets and why, lifted from there (audited), the tools' calls per hour and the
latest limit events; operators lift, auditors read, nobody else opens it. Through the
admin's real views, with a limit reached the way the worker reaches it."""

import re
from datetime import datetime
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import limits
from conversations.models import Contact, Turn
from tests.unit.test_roles import logged_in
from tools.models import ToolPolicy

pytestmark = pytest.mark.django_db
PAGE = "/admin/conversations/contact/limits/"


@pytest.fixture
def channels(make_channel):
    return {"shop": make_channel("shop", name="Tienda", turns_per_contact_per_hour=1, tokens_per_contact_per_day=5000),
            "quiet": make_channel("quiet", name="Sin límites")}


@pytest.fixture
def over_the_limit(channels, make_conversation):
    """Ana, on the shop (one turn an hour), holds a finished turn; her next one is held."""
    conversation = make_conversation(channels["shop"], "ana")
    Turn.objects.create(conversation=conversation, merged_input="hola", flush_reason="window", state="done",
                        owner="w1", started_at=timezone.now())
    second = Turn.objects.create(conversation=conversation, merged_input="¿sigues?", flush_reason="window",
                                 state="running", owner="w1", started_at=timezone.now())
    assert limits.hold_if_over(second)
    return Contact.objects.get(pk=conversation.contact_id)


def _row(html: str, row_id: str) -> str:
    found = re.search(rf'<tr id="{row_id}"[^>]*>(.*?)</tr>', html, re.S)
    assert found, f"no row {row_id}"
    return unescape(found.group(1))


def test_the_page_lists_every_channels_limits_and_says_which_set_none(client, channels):
    operator = logged_in(client, "olga", "operator")
    html = operator.get(PAGE).content.decode()
    shop = _row(html, "channel-shop")
    assert "Tienda" in shop and ">1<" in shop and ">5000<" in shop
    quiet = _row(html, "channel-quiet")
    assert "No limit: every message is answered." in quiet
    assert "1 channel sets no limit." in html
    # Each channel's limits are changed on its own page, one click away.
    for slug, channel in channels.items():
        change = reverse("admin:conversations_channel_change", args=[channel.pk])
        assert f'href="{change}"' in _row(html, f"channel-{slug}")
        assert operator.get(change).status_code == 200


def test_the_tools_calls_per_hour_are_listed(client, channels):
    ToolPolicy.objects.create(name="refund", max_per_hour=3)
    ToolPolicy.objects.create(name="lookup_order")
    html = logged_in(client, "olga", "operator").get(PAGE).content.decode()
    assert ">3<" in _row(html, "tool-refund")
    assert "No limit" in _row(html, "tool-lookup_order")
    assert reverse("admin:tools_toolpolicy_change", args=[ToolPolicy.objects.get(name="refund").pk]) in html


def test_a_person_over_a_limit_shows_when_it_resets_and_why_and_is_lifted(client, over_the_limit):
    operator = logged_in(client, "olga", "operator")
    html = operator.get(PAGE).content.decode()
    row = _row(html, f"person-{over_the_limit.pk}")
    assert "Ana" in row and "shop" in row and "1 turns per hour" in row
    resets = datetime.fromisoformat(re.search(r'<time class="limits-until" datetime="([^"]+)"', row).group(1))
    assert resets == over_the_limit.limited_until  # the oldest turn of the hour leaves it
    assert re.search(r"in (59|1:00|1 hour)", row), row
    assert 'id="card-limited"' not in html  # (the overview's card is on the first screen)

    lifted = operator.post(PAGE, {"contact": [over_the_limit.pk]}, follow=True)
    assert lifted.redirect_chain == [(PAGE, 302)]
    page = lifted.content.decode()
    assert "Limit lifted for 1 person" in page and "Nobody is over a limit now." in page
    over_the_limit.refresh_from_db()
    assert over_the_limit.limited_until is None and over_the_limit.limits_counted_from is not None
    event = AuditEvent.objects.get(kind=EventKind.LIMIT_LIFTED)
    assert event.actor == "admin:olga" and event.target == "contact ana" and event.channel_slug == "shop"
    # Both ends of the episode are among the latest limit events, linked to the audit trail.
    events = re.search(r'<ol class="limits-events">(.*?)</ol>', page, re.S).group(1)
    assert events.index("An operator lifted") < events.index("A person reached a limit")
    # Who, why and by whom, in words (not the audit's "contact ana" target).
    assert "by admin:olga" in events and events.count("1 turns per hour") == 2 and "contact ana" not in events
    assert reverse("admin:audit_auditevent_change", args=[event.pk]) in events


def test_an_auditor_reads_but_cannot_lift(client, over_the_limit):
    auditor = logged_in(client, "audrey", "auditor")
    page = auditor.get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert "1 turns per hour" in _row(html, f"person-{over_the_limit.pk}")
    assert 'name="contact"' not in html  # no lift button
    assert reverse("admin:conversations_channel_change", args=[over_the_limit.channel_id]) not in html
    assert auditor.post(PAGE, {"contact": [over_the_limit.pk]}).status_code == 403
    over_the_limit.refresh_from_db()
    assert over_the_limit.limited_until > timezone.now()
    assert not AuditEvent.objects.filter(kind=EventKind.LIMIT_LIFTED).exists()


def test_nobody_else_opens_it(client, channels):
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert client.post(PAGE, {"contact": ["1"]}).status_code == 302
    # Staff without a role: refused.
    client.force_login(User.objects.create_user("stan", password="pw-stan-1", is_staff=True))
    assert client.get(PAGE).status_code == 403


def test_the_sidebar_and_the_overview_lead_here(client, over_the_limit):
    operator = logged_in(client, "olga", "operator")
    html = operator.get("/admin/").content.decode()
    card = re.search(r'id="card-limited" href="([^"]*)"', html).group(1)
    assert unescape(card) == PAGE
    assert f'href="{PAGE}"' in html  # the sidebar's Limits entry, under Configure


def test_the_contacts_list_links_a_limit_to_the_page(client, over_the_limit):
    html = logged_in(client, "olga", "operator").get("/admin/conversations/contact/?limited=now").content.decode()
    assert f'<a href="{PAGE}">' in html and "1 turns per hour" in html
