"""`Idempotency-Key` (agentloop/core/idempotency.py) where the end-to-end tests cannot
reach: a 5xx or a crash frees the key, a request that died in flight gives its key up
after the lease, a kept answer is given up after 24 h and deleted by retention, and the
schema documents the header and its answers on every POST. Views of the tests' own
(ApiView subclasses called through DRF's request factory), real keys, real database."""

from datetime import timedelta

import pytest
import yaml
from django.utils import timezone
from rest_framework import status
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory

from agentloop.core import idempotency
from agentloop.core.idempotency import ApiView
from agentloop.core.models import IdempotentRequest
from conversations import retention
from conversations.api_auth import AgentKeyAuthentication

pytestmark = pytest.mark.django_db


class Counting(ApiView):
    """Answers `answers` in turn (a status each), counting its runs; "crash" raises."""

    authentication_classes = [AgentKeyAuthentication]
    answers: list = []
    runs = 0

    def post(self, request):
        type(self).runs += 1
        answer = type(self).answers.pop(0)
        if answer == "crash":
            raise RuntimeError("the view crashed")
        return Response({"run": type(self).runs}, status=answer)


@pytest.fixture
def call(make_channel, agent_key):
    secret = agent_key(make_channel("shop"))
    Counting.runs = 0
    view = Counting.as_view()

    def post(*answers, key="k", body=None):
        Counting.answers = list(answers)
        request = APIRequestFactory().post("/api/v1/things", body or {"a": 1}, format="json",
                                           HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY=key)
        response = view(request)
        response.render() if hasattr(response, "render") else None
        return response

    return post


def test_a_5xx_is_not_kept_and_the_retry_runs(call):
    assert call(status.HTTP_503_SERVICE_UNAVAILABLE).status_code == 503
    assert not IdempotentRequest.objects.exists()
    retried = call(status.HTTP_201_CREATED)
    assert retried.status_code == 201 and Counting.runs == 2
    again = call(status.HTTP_201_CREATED)
    assert again.content == retried.content and again["Idempotent-Replayed"] == "true" and Counting.runs == 2


def test_a_crash_frees_the_key(call):
    with pytest.raises(RuntimeError):
        call("crash")
    assert not IdempotentRequest.objects.exists()
    assert call(status.HTTP_200_OK).status_code == 200 and Counting.runs == 2


def test_a_request_dead_in_flight_gives_its_key_up_after_the_lease(call):
    now = timezone.now()
    IdempotentRequest.objects.create(owner="conversations.agentkey:0", key="other-owner", fingerprint="x")
    dead = call(status.HTTP_200_OK)  # kept; then made to look like a request killed mid-run
    row = IdempotentRequest.objects.get(key="k")
    IdempotentRequest.objects.filter(pk=row.pk).update(status=None, lease_until=now + timedelta(seconds=30))
    assert call(status.HTTP_200_OK).status_code == 409 and Counting.runs == 1
    IdempotentRequest.objects.filter(pk=row.pk).update(lease_until=now - timedelta(seconds=1))
    taken_over = call(status.HTTP_201_CREATED)
    assert taken_over.status_code == 201 and Counting.runs == 2 and dead.status_code == 200
    assert IdempotentRequest.objects.get(pk=row.pk).status == 201


def test_a_kept_answer_older_than_a_day_is_given_up_and_pruned(call):
    call(status.HTTP_200_OK)
    IdempotentRequest.objects.update(created_at=timezone.now() - idempotency.KEEP - timedelta(minutes=1))
    other_body = call(status.HTTP_201_CREATED, body={"a": 2})  # no 422: the old one is past its day
    assert other_body.status_code == 201 and Counting.runs == 2
    IdempotentRequest.objects.update(created_at=timezone.now() - idempotency.KEEP - timedelta(minutes=1))
    IdempotentRequest.objects.create(owner="auth.user:1", key="young", fingerprint="y")
    deleted = retention.sweep()
    assert deleted == {"agentloop.IdempotentRequest": 1}
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["young"]


def test_every_post_documents_the_key_and_its_answers(client):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    posts = {path: ops["post"] for path, ops in schema["paths"].items() if "post" in ops}
    assert len(posts) >= 13
    for path, operation in posts.items():
        [header] = [p for p in operation["parameters"] if p["in"] == "header"]
        assert header["name"] == "Idempotency-Key" and header["schema"]["format"] == "idempotency-key"
        assert {"400", "409", "422"} <= set(operation["responses"]), path
