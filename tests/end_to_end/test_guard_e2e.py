"""The guard across real processes: concurrent identical calls over HTTP, two operators
applying one proposal at once, and processes killed (SIGKILL) between claim and confirm."""

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEvent, EventKind
from tests.conftest import wait_until
from tests.fakes.smtp_server import FakeSMTP
from tests.support import local_http
from tests.support.e2e import operator_session
from tools.models import ActionClaim, CalendarEvent, ClaimState, Proposal, ProposalState, ToolPolicy

EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}


@pytest.fixture
def shop(make_channel):
    return make_channel("shop")


@pytest.fixture
def conversation(shop, make_conversation):
    return make_conversation(shop, "ana")


@pytest.fixture
def key(shop, agent_key):
    return agent_key(shop)


def invoke(web, key, name, body, timeout=30):
    return local_http.post(f"{web.url}/api/v1/tools/{name}/invoke", json=body, timeout=timeout,
                      headers={"Authorization": f"Bearer {key}"})


def test_64_concurrent_identical_calls_make_one_effect(processes, key, conversation):
    webs = [processes.web(), processes.web()]
    barrier = threading.Barrier(64)
    body = {"conversation": conversation.pk, "arguments": EVENT}

    def call(i):
        barrier.wait()
        return invoke(webs[i % 2], key, "calendar_create_event", body)

    with ThreadPoolExecutor(64) as pool:
        responses = list(pool.map(call, range(64)))

    assert [r.status_code for r in responses] == [200] * 64, [r.text for r in responses if r.status_code != 200]
    statuses = [r.json()["status"] for r in responses]
    assert statuses.count("done") == 1, statuses
    assert statuses.count("duplicate") + statuses.count("in_progress") == 63
    assert CalendarEvent.objects.count() == 1
    assert ActionClaim.objects.count() == 1 and ActionClaim.objects.get().state == ClaimState.DONE
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 63
    done = next(r.json() for r in responses if r.json()["status"] == "done")
    assert all(r.json()["original"]["claim"] == done["claim"] for r in responses if r.json()["duplicate"])


def test_two_operators_applying_at_once_run_it_once(processes, key, conversation):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    User = get_user_model()
    for name in ("olga", "pablo"):
        User.objects.create_superuser(name, f"{name}@example.com", "pw-" + name)
    webs = [processes.web(), processes.web()]
    proposed = invoke(webs[0], key, "calendar_create_event", {"conversation": conversation.pk, "arguments": EVENT})
    assert proposed.status_code == 202
    proposal = proposed.json()["proposal"]
    sessions = [operator_session(webs[0], "olga", "pw-olga"), operator_session(webs[1], "pablo", "pw-pablo")]
    barrier = threading.Barrier(4)

    def press(session):
        barrier.wait()
        return session.post(f"/admin/tools/proposal/{proposal}/apply/",
                            data={"csrfmiddlewaretoken": session.cookies["csrftoken"]})

    with ThreadPoolExecutor(4) as pool:  # each operator double-clicks
        responses = list(pool.map(press, sessions * 2))
    assert all(r.status_code == 302 for r in responses), [r.text[:300] for r in responses]
    assert CalendarEvent.objects.count() == 1
    applied = Proposal.objects.get(pk=proposal)
    assert applied.state == ProposalState.APPLIED and applied.decided_by in ("olga", "pablo")
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_APPLIED).count() == 1
    # A later Apply through the page changes nothing either.
    again = sessions[1].post(f"/admin/tools/proposal/{proposal}/apply/",
                             data={"csrfmiddlewaretoken": sessions[1].cookies["csrftoken"]})
    assert again.status_code == 302 and CalendarEvent.objects.count() == 1


def test_killed_between_claim_and_confirm_calendar_is_reconciled(processes, key, conversation, tmp_path):
    """The web process writes the event, then dies before confirming the claim."""
    marker = tmp_path / "event-written"
    ToolPolicy.objects.create(name="calendar_create_event_then_hang", timeout_seconds=1)
    env = {"AGENTLOOP_EXTRA_TOOLS": "tests.support.tools_for_tests.CreateEventThenHang"}
    web = processes.web(AGENTLOOP_TEST_MARKER=marker, **env)
    body = {"conversation": conversation.pk, "arguments": EVENT}
    hanging = threading.Thread(target=lambda: _swallow(invoke, web, key, "calendar_create_event_then_hang", body))
    hanging.start()
    # Its content, not only its existence: write_text creates the file before it writes.
    wait_until(lambda: marker.exists() and marker.read_text(), timeout=20, message="the event to be written")
    web.kill()
    hanging.join(10)
    claim = ActionClaim.objects.get()
    assert claim.state == ClaimState.IN_FLIGHT and CalendarEvent.objects.count() == 1

    web = processes.web(**env)  # the tool would hang again if it were re-run: it must not be
    again = invoke(web, key, "calendar_create_event_then_hang", {**body, "arguments": {**EVENT, "location": "X"}})
    assert again.status_code == 200
    answer = again.json()
    assert answer["status"] == "duplicate" and answer["original"]["claim"] == claim.pk
    assert answer["result"]["event_id"] == Path(marker).read_text()
    assert CalendarEvent.objects.count() == 1
    claim.refresh_from_db()
    assert claim.state == ClaimState.DONE
    kinds = set(AuditEvent.objects.values_list("kind", flat=True))
    assert {EventKind.ACTION_UNCERTAIN, EventKind.ACTION_RECONCILED, EventKind.DUPLICATE_PREVENTED} <= kinds


def test_killed_while_the_mail_server_holds_the_message_is_reported(processes, key, conversation):
    ToolPolicy.objects.create(name="email_send", timeout_seconds=1)
    mail = {"to": "ana@example.com", "subject": "Factura", "body": "Adjunta."}
    with FakeSMTP() as smtp:
        smtp.hold = True
        web = processes.web(EMAIL_URL=smtp.url)
        body = {"conversation": conversation.pk, "arguments": mail}
        hanging = threading.Thread(target=lambda: _swallow(invoke, web, key, "email_send", body))
        hanging.start()
        assert smtp.data_started.wait(20)
        web.kill()
        hanging.join(10)
        smtp.release.set()  # whatever the server does now, the sender never learnt it

        web = processes.web(EMAIL_URL=smtp.url)
        connections = smtp.connections
        again = invoke(web, key, "email_send", body)
        assert again.status_code == 200
        answer = again.json()
        assert answer["status"] == "uncertain" and answer["duplicate"] is True
        assert "may or may not have happened" in answer["note"]
        assert smtp.connections == connections  # never re-sent
        assert ActionClaim.objects.get().state == ClaimState.UNCERTAIN


def _swallow(fn, *args):
    try:
        fn(*args)
    except httpx.HTTPError:
        pass  # the server was killed under this request
