"""A tool that fails with a secret in its message (the value of an environment variable
like PARTNER_API_KEY, a URL with credentials): the secret reaches neither the model (the
outcome's body), nor an agent key's `/tools/…/invoke` answer, nor a stored context note."""

import json

import pytest

from agentloop.core.redaction import forget_secrets
from conversations.models import ContextNote
from conversations.notes import inform
from tests.support.tools_for_tests import LeakyCreate
from tools import approvals, guard
from tools.models import ActionClaim, Proposal, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db
PARTNER_KEY = "pk-live-Partner-8812ZZ"


@pytest.fixture(autouse=True)
def partner_key(monkeypatch, settings):
    monkeypatch.setenv("PARTNER_API_KEY", PARTNER_KEY)
    forget_secrets()  # the deployment's secrets are read again at the next redaction
    settings.AGENTLOOP_TOOLS = ["tools.builtin.calendar.CreateEvent", "tests.support.tools_for_tests.LeakyCreate"]
    yield
    forget_secrets()


@pytest.fixture
def conversation(make_channel, make_conversation):
    return make_conversation(make_channel("shop"), "ana")


@pytest.mark.parametrize("crash", [False, True], ids=["tool-error", "unexpected-exception"])
def test_the_model_never_sees_a_tools_secret(conversation, crash):
    outcome = guard.invoke(LeakyCreate.name, {"name": "x", "crash": crash}, Scope.of_conversation(conversation),
                           actor="test")
    body = json.dumps(outcome.for_model())
    assert "the partner refused key" in body and PARTNER_KEY not in body, body
    assert PARTNER_KEY not in ActionClaim.objects.get(pk=outcome.claim_id).error


def test_an_unguarded_tools_failure_is_masked_too(conversation):
    ToolPolicy.objects.create(name=LeakyCreate.name, guarded=False, approval="none")
    outcome = guard.invoke(LeakyCreate.name, {"name": "x"}, Scope.of_conversation(conversation), actor="test")
    assert outcome.status == guard.Status.FAILED and PARTNER_KEY not in json.dumps(outcome.for_model())


def test_the_invoke_answer_never_carries_a_tools_secret(client, make_channel, agent_key):
    key = agent_key(make_channel("api-shop"))
    response = client.post(f"/api/v1/tools/{LeakyCreate.name}/invoke",
                           data=json.dumps({"arguments": {"name": "x"}, "scope": "partner"}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "failed" and PARTNER_KEY not in response.content.decode()


def test_a_failed_approved_action_leaves_no_secret_in_the_agents_note(conversation):
    ToolPolicy.objects.create(name=LeakyCreate.name, approval="operator")
    proposed = guard.invoke(LeakyCreate.name, {"name": "x"}, Scope.of_conversation(conversation), actor="test")
    approvals.apply(proposed.proposal_id, by="boss")
    note = ContextNote.objects.get(conversation=conversation).text
    assert "but it failed" in note and PARTNER_KEY not in note, note
    assert PARTNER_KEY not in Proposal.objects.get(pk=proposed.proposal_id).error


def test_every_note_is_stored_redacted(conversation):
    inform(conversation.pk, for_agent=f"the partner said: bad key {PARTNER_KEY}")
    assert PARTNER_KEY not in ContextNote.objects.get(conversation=conversation).text
