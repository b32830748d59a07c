"""Turns handed to external agents, through the REST API of the real web server: an agent
key claims only turns of `pull` channels, and a turn external agents keep dropping stops
after AGENTLOOP_EXTERNAL_TURN_ATTEMPTS claims — it fails and the user is told. The
release runs as the worker's housekeeping and django-q2's sweep run it, with the clock
moved past the claim timeout instead of waiting for it."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import engine, flushing, turns
from conversations.models import Turn, TurnState
from delivery.models import OutboundKind, OutboundMessage
from tests.support import local_http

pytestmark = pytest.mark.e2e


def api(web, key, method, path, body=None):
    return local_http.request(method, f"{web.url}{path}", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {key}"})


def ready_turn(web, key, slug):
    """A message through the API, its buffer flushed into a READY turn (no worker runs)."""
    response = api(web, key, "POST", f"/api/v1/channels/{slug}/messages",
                   {"message_id": f"{slug}-1", "contact": "ana", "text": "¿Tienen hora el lunes?"})
    assert response.status_code == 202, response.text
    [turn] = flushing.flush_due(timezone.now() + timedelta(minutes=1))
    assert turn.state == TurnState.READY
    return turn


def past_the_claim_timeout():
    return timezone.now() + timedelta(seconds=settings.AGENTLOOP_EXTERNAL_TURN_TIMEOUT + 1)


def test_a_key_claims_only_turns_of_pull_channels(processes, make_channel, agent_key):
    echoed, pulled = make_channel("echoed", agent="echo"), make_channel("pulled", agent="pull")
    key = agent_key(echoed, pulled)
    web = processes.web()
    theirs = ready_turn(web, key, "echoed")
    refused = api(web, key, "POST", f"/api/v1/turns/{theirs.pk}/claim")
    assert refused.status_code == 409 and "only turns of pull channels" in refused.json()["error"]
    assert Turn.objects.get(pk=theirs.pk).state == TurnState.READY  # still its worker's to run
    assert not turns.claim_external(theirs.pk, 1)  # the transition itself refuses it too
    mine = ready_turn(web, key, "pulled")
    assert api(web, key, "POST", f"/api/v1/turns/{mine.pk}/claim").status_code == 200


def test_a_turn_dropped_again_and_again_fails_and_the_user_is_told(processes, make_channel, agent_key):
    key = agent_key(make_channel("pulled", agent="pull"))
    web = processes.web()
    turn = ready_turn(web, key, "pulled")
    for attempt in range(1, settings.AGENTLOOP_EXTERNAL_TURN_ATTEMPTS + 1):
        claimed = api(web, key, "POST", f"/api/v1/turns/{turn.pk}/claim")
        assert claimed.status_code == 200, (attempt, claimed.text)
        engine.recovery_sweep()  # not yet past the timeout: nothing happens
        assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
        released = turns.release_external(past_the_claim_timeout())
        assert released == ([turn.pk] if attempt < settings.AGENTLOOP_EXTERNAL_TURN_ATTEMPTS else [])
    failed = Turn.objects.get(pk=turn.pk)
    assert failed.state == TurnState.FAILED and failed.attempts == settings.AGENTLOOP_EXTERNAL_TURN_ATTEMPTS
    assert "no external agent finished it" in failed.outcome
    [notice] = OutboundMessage.objects.filter(turn=failed)
    assert notice.kind == OutboundKind.NOTICE and notice.text == turns.EXTERNAL_GAVE_UP_NOTICE
    assert AuditEvent.objects.filter(kind=EventKind.TURN_FAILED, target=f"turn {turn.pk}").count() == 1
    assert api(web, key, "POST", f"/api/v1/turns/{turn.pk}/claim").status_code == 409
    listed = api(web, key, "GET", "/api/v1/turns?state=failed").json()
    assert [t["id"] for t in listed] == [turn.pk]
    assert turns.release_external(past_the_claim_timeout()) == []  # and nothing more happens
    assert OutboundMessage.objects.filter(turn=failed).count() == 1
