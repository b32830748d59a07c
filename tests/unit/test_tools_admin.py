"""The guard in the operator's admin: policies, claims (reconcile / release), proposals
(Apply / Reject), caught duplicates with their counts, the local calendar and its feed."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from icalendar import Calendar as ICalendar

from tools import guard, registry
from tools.models import ActionClaim, Calendar, CalendarEvent, ClaimState, Proposal, ProposalState, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00", "location": "Consulta 3"}


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("olga", "olga@example.com", "pw-olga-1"))
    return client


@pytest.fixture
def scope(make_channel, make_conversation):
    return Scope.of_conversation(make_conversation(make_channel("shop"), "ana"))


def test_every_registered_tool_has_a_policy_page(operator):
    page = operator.get(reverse("admin:tools_toolpolicy_changelist"))
    assert page.status_code == 200
    assert set(ToolPolicy.objects.values_list("name", flat=True)) >= set(registry.all_tools())
    html = page.content.decode()
    assert "<code>title</code> + <code>start_datetime</code> (default)" in html
    assert "<code>to</code> + <code>subject</code> + <code>body</code> (default)" in html
    policy = ToolPolicy.objects.get(name="calendar_create_event")
    assert operator.get(reverse("admin:tools_toolpolicy_change", args=[policy.pk])).status_code == 200


def test_an_edited_policy_applies_to_the_next_call(operator, scope):
    guard.invoke("calendar_create_event", EVENT, scope, actor="t")
    policy = ToolPolicy.objects.get(name="calendar_create_event")
    response = operator.post(reverse("admin:tools_toolpolicy_change", args=[policy.pk]), {
        "name": policy.name, "enabled": "on", "window_seconds": 600, "fingerprint_fields": '["title"]',
        "approval": "operator", "approval_ttl_seconds": 60, "timeout_seconds": 60, "guarded": "on"})
    assert response.status_code == 302, response.content.decode()[:2000]
    moved = guard.invoke("calendar_create_event", {**EVENT, "title": "Kine"}, scope, actor="t")
    assert moved.status == "awaiting_approval"


def test_claims_duplicates_and_their_links(operator, scope):
    first = guard.invoke("calendar_create_event", EVENT, scope, actor="t")
    guard.invoke("calendar_create_event", EVENT, scope, actor="t")
    claims = operator.get(reverse("admin:tools_actionclaim_changelist") + "?state=done")
    assert claims.status_code == 200 and "calendar_create_event" in claims.content.decode()
    detail = operator.get(reverse("admin:tools_actionclaim_change", args=[first.claim_id])).content.decode()
    assert "Psicología" in detail and "name=\"_save\"" not in detail  # read-only history
    caught = operator.get(reverse("admin:audit_caughtduplicate_changelist")).content.decode()
    assert 'id="duplicate-counts"' in caught
    assert "<td>calendar_create_event</td><td>1</td>" in caught
    assert reverse("admin:tools_actionclaim_change", args=[first.claim_id]) in caught  # → the original claim


def test_reconcile_and_release_uncertain_claims(operator, scope):
    tool = registry.get("calendar_create_event")
    claims = []
    for title in ("happened", "lost"):
        arguments = {**EVENT, "title": title}
        attempt = guard.take_claim(guard.ClaimRequest(tool.name, arguments, scope, tool.fingerprint(arguments, scope),
                                                      guard.policy_for(tool.name)), owner="worker:dead")
        guard.mark_uncertain(attempt.claim)
        claims.append(attempt.claim)
    tool.run(guard.helpers._call_of(claims[0]))
    url = reverse("admin:tools_actionclaim_changelist")
    ids = [str(c.pk) for c in claims]
    operator.post(url, {"action": "reconcile_claims", "_selected_action": ids})
    states = dict(ActionClaim.objects.values_list("pk", "state"))
    assert states[claims[0].pk] == ClaimState.DONE  # the event was there
    assert states[claims[1].pk] == ClaimState.RELEASED  # the calendar says it never happened


def test_apply_and_reject_from_the_proposal_page(operator, scope):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    apply_me = guard.invoke("calendar_create_event", EVENT, scope, actor="t").proposal_id
    reject_me = guard.invoke("calendar_create_event", {**EVENT, "title": "Kine"}, scope, actor="t").proposal_id
    page = operator.get(reverse("admin:tools_proposal_change", args=[apply_me])).content.decode()
    decision = page[page.index('id="proposal-decision"'):]
    assert 'value="apply"' in decision and 'value="reject"' in decision and "Apply" in decision
    assert 'name="_save"' not in page  # decided with the buttons, never saved
    assert operator.get(reverse("admin:tools_proposal_apply", args=[apply_me])).status_code == 405  # POST only
    assert operator.post(reverse("admin:tools_proposal_apply", args=[apply_me])).status_code == 302
    assert operator.post(reverse("admin:tools_proposal_reject", args=[reject_me])).status_code == 302
    assert dict(Proposal.objects.values_list("pk", "state")) == {apply_me: ProposalState.APPLIED,
                                                                 reject_me: ProposalState.REJECTED}
    assert list(CalendarEvent.objects.values_list("title", flat=True)) == ["Psicología"]
    done = operator.get(reverse("admin:tools_proposal_change", args=[apply_me])).content.decode()
    assert 'id="proposal-decision"' not in done  # nothing left to decide
    listing = operator.get(reverse("admin:tools_proposal_changelist")).content.decode()
    assert "Applied" in listing and "Rejected" in listing


@pytest.mark.parametrize("next_url", ["https://evil.example/phish", "//evil.example/x", "http:///evil.example",
                                      "javascript:alert(1)"])
def test_a_decision_never_redirects_off_the_site(operator, scope, next_url):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    first = guard.invoke("calendar_create_event", EVENT, scope, actor="t").proposal_id
    second = guard.invoke("calendar_create_event", {**EVENT, "title": "Kine"}, scope, actor="t").proposal_id
    for view, pk in (("apply", first), ("reject", second)):
        response = operator.post(reverse(f"admin:tools_proposal_{view}", args=[pk]), {"next": next_url})
        assert response.status_code == 302
        assert response["Location"] == reverse("admin:tools_proposal_change", args=[pk])


def test_a_decision_returns_to_a_page_of_the_site(operator, scope):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    proposal = guard.invoke("calendar_create_event", EVENT, scope, actor="t").proposal_id
    response = operator.post(reverse("admin:tools_proposal_apply", args=[proposal]), {"next": "/console/"})
    assert response.status_code == 302 and response["Location"] == "/console/"
    assert Proposal.objects.get(pk=proposal).state == ProposalState.APPLIED


def test_an_expired_proposal_offers_no_buttons(operator, scope):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    proposal = guard.invoke("calendar_create_event", EVENT, scope, actor="t").proposal_id
    Proposal.objects.filter(pk=proposal).update(expires_at=timezone.now() - timedelta(seconds=1))
    page = operator.get(reverse("admin:tools_proposal_change", args=[proposal])).content.decode()
    assert 'id="proposal-decision"' not in page
    operator.post(reverse("admin:tools_proposal_apply", args=[proposal]))
    assert Proposal.objects.get(pk=proposal).state == ProposalState.EXPIRED and not CalendarEvent.objects.exists()


def test_the_local_calendar_in_the_admin_and_as_an_icalendar_feed(operator, client, scope):
    guard.invoke("calendar_create_event", {**EVENT, "attendees": ["ana@example.com"]}, scope, actor="t")
    calendar = Calendar.objects.get()
    page = operator.get(reverse("admin:tools_calendar_change", args=[calendar.pk])).content.decode()
    feed_url = reverse("calendar-feed", args=[calendar.feed_token])
    assert "Psicología" in page and feed_url in page
    assert operator.get(reverse("admin:tools_calendarevent_changelist")).status_code == 200
    response = client.get(feed_url)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/calendar")
    [event] = ICalendar.from_ical(response.content).walk("VEVENT")
    assert str(event["SUMMARY"]) == "Psicología" and str(event["LOCATION"]) == "Consulta 3"
    assert event.decoded("DTSTART") == CalendarEvent.objects.get().start
    assert client.get(reverse("calendar-feed", args=["wrong-token"])).status_code == 404


def test_setting_user_approval_warns_about_api_channels(operator, make_channel):
    """`approval = user` is refused at run time on api channels (anyone holding a key
    could answer "yes"): saving it says which channels will refuse it."""
    make_channel("partner-api", kind="api")
    make_channel("tg", kind="telegram")
    policy = ToolPolicy.objects.create(name="calendar_create_event")
    response = operator.post(reverse("admin:tools_toolpolicy_change", args=[policy.pk]), {
        "name": policy.name, "enabled": "on", "window_seconds": 600, "fingerprint_fields": "[]",
        "approval": "user", "approval_ttl_seconds": 60, "timeout_seconds": 60, "guarded": "on"}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("partner-api" in m and "refused" in m and "tg" not in m.split(":")[-1] for m in shown), shown


def test_the_proposal_page_shows_every_recipient_and_the_whole_body(operator, scope):
    """An operator approves what they can read: nothing of the arguments is cut."""
    recipients = [f"cliente{n}@example.com" for n in range(20)]
    body = "Estimada clienta,\n" + "lorem ipsum " * 100 + "\nPD: transfiera a ES00-LAST-LINE"
    proposal = guard.invoke("email_send", {"to": recipients, "subject": "Aviso", "body": body}, scope,
                            actor="t").proposal_id
    page = operator.get(reverse("admin:tools_proposal_change", args=[proposal])).content.decode()
    assert all(address in page for address in recipients)
    assert "PD: transfiera a ES00-LAST-LINE" in page and "lorem ipsum " * 100 in page


def test_a_proposal_reads_its_arguments_as_pairs_and_its_expiry_as_a_duration(operator, scope):
    ToolPolicy.objects.create(name="email_send", approval="operator", approval_ttl_seconds=86400)
    body = "línea " * 2000  # a whole email: 12,000 characters
    arguments = {"to": ["ana@example.com", "luis@example.com"], "subject": "Cita", "body": body}
    proposal = guard.invoke("email_send", arguments, scope, actor="t").proposal_id
    page = operator.get(reverse("admin:tools_proposal_change", args=[proposal])).content.decode()
    # name: value, every recipient, the whole body; no JSON braces or quotes.
    assert "<dt>to</dt><dd>ana@example.com, luis@example.com</dd>" in page
    assert "<dt>subject</dt><dd>Cita</dd>" in page and body.strip() in page and '{"to"' not in page
    assert "in 1\xa0day" in page and "1440" not in page  # (a duration never wraps in two)
    listing = operator.get(reverse("admin:tools_proposal_changelist")).content.decode()
    assert "to: ana@example.com, luis@example.com; subject: Cita; body: línea" in listing
    assert body.strip() not in listing  # cut, linked to the page where it is whole
    assert f'href="{reverse("admin:tools_proposal_change", args=[proposal])}"' in listing
    assert "in 1\xa0day" in listing
    spanish = operator.get(reverse("admin:tools_proposal_changelist"), HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "1\xa0día" in spanish  # Django's own words for the units


def test_a_claims_page_reads_its_arguments_and_offers_no_save(operator, scope):
    claim = guard.invoke("calendar_create_event", EVENT, scope, actor="t").claim_id
    page = operator.get(reverse("admin:tools_actionclaim_change", args=[claim])).content.decode()
    assert "<dt>title</dt><dd>Psicología</dd>" in page and "<dt>location</dt><dd>Consulta 3</dd>" in page
    assert 'name="_save"' not in page
    listing = operator.get(reverse("admin:tools_actionclaim_changelist")).content.decode()
    # Cut to a column's width, linked to the claim's page where they are whole.
    assert "title: Psicología; start_datetime: 2026-12-01T10:00; locati…" in listing
    assert f'href="{reverse("admin:tools_actionclaim_change", args=[claim])}"' in listing
