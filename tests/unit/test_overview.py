"""The admin's first screen and its navigation (issue 53): what needs a person now, each
count a link to where it is dealt with; the sidebar by what an operator does, showing each
person only what their role opens; every admin page in the theme, Django's and the
libraries' included; the language switch."""

import os
import re
import socket
from html import unescape

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from unfold.admin import ModelAdmin

from conversations import handoff
from conversations.models import Turn, WorkerHeartbeat
from tests.unit.test_roles import logged_in
from tools import guard
from tools.models import ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}


@pytest.fixture
def operator(client):
    return logged_in(client, "olga", "operator")


def _card(html: str, key: str) -> tuple[str, str]:
    """(its classes, its count) of the overview card `key`."""
    found = re.search(rf'<a class="([^"]*)" id="card-{key}" href="([^"]*)">\s*<span class="overview-count">([^<]*)<',
                      html)
    assert found, f"no card {key}"
    return found.group(1), found.group(3).strip()


def _sidebar(html: str) -> list[str]:
    return [unescape(t) for t in re.findall(r'<h2[^>]*>\s*([^<]+?)\s*</h2>', html)]


def test_zeros_are_calm_but_no_worker_alive_needs_someone(operator):
    html = operator.get("/admin/").content.decode()
    for key in ("approvals", "held", "paused", "given_up", "owed", "failed_turns", "limited"):
        classes, count = _card(html, key)
        assert count == "0" and "attention" not in classes, key
    # No worker alive is the one zero that needs someone: nothing would be answered.
    classes, count = _card(html, "workers")
    assert count == "0" and "attention" in classes
    assert "Needs a person now" in html


def test_with_a_worker_alive_nothing_waits(operator):
    WorkerHeartbeat.objects.create(owner=f"test:{os.getpid()}:1", hostname=socket.gethostname(), pid=os.getpid())
    html = operator.get("/admin/").content.decode()
    classes, count = _card(html, "workers")
    assert count == "1" and "attention" not in classes
    assert "Nothing waits for a person" in html


def test_what_waits_for_a_person_is_counted_and_one_click_away(operator, make_channel, make_conversation):
    conversation = make_conversation(make_channel("shop"), "ana")
    Turn.objects.create(conversation=conversation, merged_input="agéndame", flush_reason="window", state="running",
                        owner="w1", started_at=timezone.now())
    guard.policy_for("calendar_create_event")  # the policy row, made on first use
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval="operator")
    guard.forget_policies()
    assert guard.invoke("calendar_create_event", EVENT, Scope.of_conversation(conversation), actor="t").status \
        == "awaiting_approval"
    assert handoff.take_over(conversation.pk, "admin:olga")

    html = operator.get("/admin/").content.decode()
    assert "Needs a person now" in html
    classes, count = _card(html, "approvals")
    assert count == "1" and "attention" in classes
    classes, count = _card(html, "held")
    assert count == "1" and "attention" not in classes  # a person holds it: nobody else is needed
    for key in ("approvals", "held", "paused", "given_up", "owed", "failed_turns", "limited", "workers"):
        link = unescape(re.search(rf'id="card-{key}" href="([^"]*)"', html).group(1))
        assert operator.get(link).status_code == 200, (key, link)
    approvals = operator.get(unescape(re.search(r'id="card-approvals" href="([^"]*)"', html).group(1)))
    assert "calendar_create_event" in approvals.content.decode()


def test_the_sidebar_is_what_an_operator_does_and_each_role_sees_its_own(client):
    operator = logged_in(client, "olga", "operator")
    html = operator.get("/admin/").content.decode()
    groups = [g for g in _sidebar(html) if g in ("Operate", "Configure", "Observe", "System")]
    assert groups == ["Operate", "Configure", "Observe", "System"]
    for page in ("admin:conversations_channel_changelist", "admin:tools_proposal_changelist",
                 "admin:delivery_outboundmessage_changelist", "console-dashboard"):
        assert f'href="{reverse(page)}' in html, page
    client.logout()
    auditor = logged_in(client, "audrey", "auditor")
    html = auditor.get("/admin/").content.decode()
    # An auditor reads the trail, the guard and the ledger; configuring is not theirs.
    assert reverse("admin:delivery_outboundmessage_changelist") in html
    assert reverse("admin:conversations_channel_changelist") not in html
    assert "Configure" not in _sidebar(html)


def test_every_admin_page_wears_the_theme():
    plain = [m._meta.label for m, a in admin.site._registry.items() if not isinstance(a, ModelAdmin)]
    assert plain == []


def test_the_language_switch_changes_the_admin(operator):
    assert 'lang="en"' in operator.get("/admin/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    switched = operator.post(reverse("set_language"), {"language": "es", "next": "/admin/"})
    assert switched.status_code == 302 and switched["Location"] == "/admin/"
    html = operator.get("/admin/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert 'lang="es"' in html  # the choice outlives the browser's header
    # The switch is in the page, for every language the product speaks.
    for code in ("en", "es", "pt"):
        assert f'name="language" type="hidden" value="{code}"' in html


def test_the_sidebar_marks_the_one_page_you_are_on(operator):
    """Limits lives under the contacts' address; only Limits is lit there, only Contacts on
    the contacts, only the playground (not the dashboard above it) in the playground."""
    for path, lit in [(reverse("admin:conversations_contact_limits"), "Limits"),
                      (reverse("admin:conversations_contact_changelist"), "Contacts"),
                      (reverse("admin:index"), "Overview")]:
        html = operator.get(path).content.decode()
        active = re.findall(r'<a href="[^"]*" class="[^"]*\bactive">\s*(?:<span[^>]*>[^<]*</span>)?\s*'
                            r'(?:<span[^>]*>)?\s*([^<]+?)\s*<', html)
        assert active == [lit], (path, active)


def test_a_roles_permissions_are_named_in_the_readers_language(client):
    """Django stores 'Can add turn' in English when it migrates; the role's page names it
    in the reader's language (the model's name too)."""
    from django.contrib.auth.models import Group, User

    from agentloop.console import roles
    roles.ensure_roles()
    User.objects.create_superuser("root", "root@example.com", "pw-root-1")
    client.post("/admin/login/", {"username": "root", "password": "pw-root-1", "next": "/admin/"})
    role = Group.objects.get(name=roles.OPERATORS)
    html = unescape(client.get(reverse("admin:auth_group_change", args=[role.pk]),
                               HTTP_ACCEPT_LANGUAGE="es").content.decode())
    assert "Can add turn" not in html and "Can view" not in html
    assert "Puede ver" in html
