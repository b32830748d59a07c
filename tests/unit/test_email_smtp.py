"""email_send through Django's SMTP backend against a real local SMTP server: by default
a person approves each email and a contact has at most ten an hour (it is not an open
relay for whoever talks to the bot)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.fakes.smtp_server import FakeSMTP
from tools import approvals, guard, registry
from tools.guard import Status
from tools.models import ActionClaim, ClaimState, Proposal, ProposalState, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db
MAIL = {"to": ["ana@example.com", "Luis@Example.com"], "subject": "Su cita", "body": "Lunes a las 10:00.\n"}


@pytest.fixture
def smtp(settings):
    with FakeSMTP() as server:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", server.port, 5
        settings.DEFAULT_FROM_EMAIL = "citas@clinica.example"
        yield server


def send(arguments, scope=Scope("contact:1")):
    return guard.invoke("email_send", arguments, scope, actor="test")


@pytest.fixture
def trusted(db):
    """An operator who trusts their users switched approval off for email_send."""
    ToolPolicy.objects.create(name="email_send", approval="none", max_per_hour=3)


def mail(n):
    return {"to": f"cliente{n}@example.com", "subject": f"Aviso {n}", "body": "Hola."}


def test_by_default_an_email_waits_for_a_person_then_goes_out_once(smtp):
    proposed = send(MAIL)
    assert proposed.status == Status.AWAITING_APPROVAL and smtp.received == []
    policy = ToolPolicy.objects.get(name="email_send")
    assert policy.requires_approval and policy.max_per_hour == 10
    assert send(MAIL).status == Status.AWAITING_APPROVAL and Proposal.objects.count() == 1  # asked twice
    assert approvals.apply(proposed.proposal_id, by="olga").state == ProposalState.APPLIED
    assert approvals.apply(proposed.proposal_id, by="olga").state == ProposalState.APPLIED
    [received] = smtp.received
    assert received.recipients == ["ana@example.com", "Luis@Example.com"]


def test_a_contact_cannot_have_more_than_its_hourly_limit(smtp, trusted):
    assert [send(mail(n)).status for n in range(3)] == [Status.DONE] * 3
    refused = send(mail(3))
    assert refused.status == Status.FAILED and "limit of 3 per hour" in refused.error
    assert "do not retry" in refused.for_model()["note"]
    assert len(smtp.received) == 3 and ActionClaim.objects.count() == 3  # the refusal wrote no claim
    assert send(mail(3), Scope("contact:2")).status == Status.DONE  # another contact has its own
    assert send(mail(0)).status == Status.DUPLICATE  # an identical call is still answered as one


def test_an_agent_key_cannot_escape_the_limit_by_inventing_scopes(smtp, trusted, client, make_channel, agent_key):
    """A key names its own scopes (`agent:<key>:<name>`): the hourly limit counts per key too."""
    shop = make_channel("shop")
    key, other = agent_key(shop, name="shop-agent"), agent_key(shop, name="other-agent")

    def invoke(bearer, n):
        response = client.post("/api/v1/tools/email_send/invoke", content_type="application/json",
                               data={"arguments": mail(n), "scope": f"invented-{n}"},
                               HTTP_AUTHORIZATION=f"Bearer {bearer}")
        return response.json()

    assert [invoke(key, n)["status"] for n in range(3)] == [Status.DONE] * 3
    refused = invoke(key, 3)
    assert refused["status"] == Status.FAILED and "limit of 3 per hour for this agent key" in refused["error"]
    assert invoke(other, 4)["status"] == Status.DONE  # another key has its own
    assert len(smtp.received) == 4


def test_a_string_of_recipients_is_capped_like_a_list(smtp, trusted):
    addresses = [f"c{n}@example.com" for n in range(21)]
    with pytest.raises(registry.InvalidArguments):  # the list form: the schema's maxItems
        send({"to": addresses, "subject": "Hola", "body": "..."})
    for to in (", ".join(addresses), "; ".join(addresses), ",".join(addresses + [" "] * 5)):
        with pytest.raises(registry.InvalidArguments, match="at most 20 addresses"):
            send({"to": to, "subject": "Hola", "body": "..."})
    assert send({"to": ", ".join(addresses[:20]), "subject": "Hola", "body": "..."}).status == Status.DONE
    assert not ActionClaim.objects.filter(state=ClaimState.RELEASED).exists()


def test_the_limit_is_a_sliding_hour_and_failed_sends_do_not_count(smtp, trusted):
    smtp.refuse = {"cliente0@example.com"}
    assert send(mail(0)).status == Status.FAILED  # refused by the server: nothing was sent
    smtp.refuse = set()
    assert [send(mail(n)).status for n in range(1, 4)] == [Status.DONE] * 3
    assert send(mail(4)).status == Status.FAILED
    an_hour_ago = timezone.now() - timedelta(hours=1, seconds=1)
    ActionClaim.objects.filter(arguments__subject="Aviso 1").update(created_at=an_hour_ago)
    assert send(mail(4)).status == Status.DONE
    assert len(smtp.received) == 4


def test_proposals_count_and_rejected_ones_do_not(smtp):
    ToolPolicy.objects.create(name="email_send", approval="operator", max_per_hour=2)
    first, second = send(mail(1)), send(mail(2))
    assert send(mail(3)).status == Status.FAILED and Proposal.objects.count() == 2
    approvals.reject(first.proposal_id, by="olga")
    assert send(mail(3)).status == Status.AWAITING_APPROVAL
    assert smtp.received == [] and second.status == Status.AWAITING_APPROVAL


def test_sent_over_smtp_once(smtp, trusted):
    first = send(MAIL)
    assert first.status == Status.DONE
    [received] = smtp.received
    assert received.sender == "citas@clinica.example"
    assert received.recipients == ["ana@example.com", "Luis@Example.com"]
    assert received.subject == "Su cita" and received.body == "Lunes a las 10:00."
    assert received.message["Message-ID"].strip() == first.result["message_id"]
    assert f"agentloop-claim-{first.claim_id}" in first.result["message_id"]
    again = send({**MAIL, "to": ["luis@example.com", "ana@example.com"]})  # same recipients, other order/case
    assert again.status == Status.DUPLICATE and len(smtp.received) == 1


def test_a_refused_recipient_is_a_failure_that_can_be_retried(smtp, trusted):
    smtp.refuse = {"ana@example.com"}
    failed = send({**MAIL, "to": "ana@example.com"})
    assert failed.status == Status.FAILED and "refused" in failed.error
    assert ActionClaim.objects.get(pk=failed.claim_id).state == ClaimState.RELEASED
    smtp.refuse = set()
    assert send({**MAIL, "to": "ana@example.com"}).status == Status.DONE
    assert len(smtp.received) == 1
