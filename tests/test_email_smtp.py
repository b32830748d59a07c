"""email_send through Django's SMTP backend against a real local SMTP server."""

import pytest

from tools import guard
from tools.guard import Status
from tools.models import ActionClaim, ClaimState
from tools.registry import Scope
from tests.fakes.smtp_server import FakeSMTP

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


def test_sent_over_smtp_once(smtp):
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


def test_a_refused_recipient_is_a_failure_that_can_be_retried(smtp):
    smtp.refuse = {"ana@example.com"}
    failed = send({**MAIL, "to": "ana@example.com"})
    assert failed.status == Status.FAILED and "refused" in failed.error
    assert ActionClaim.objects.get(pk=failed.claim_id).state == ClaimState.RELEASED
    smtp.refuse = set()
    assert send({**MAIL, "to": "ana@example.com"}).status == Status.DONE
    assert len(smtp.received) == 1
