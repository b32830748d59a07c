"""`Idempotency-Key` on the API's POSTs (agentloop/core/idempotency.py), through the real
web server: a retried POST with the same key runs once and answers the first answer
again; the same key with another body is 422; a key whose first request is still in
flight is 409; a bad key is 400."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model

from agentloop.core.models import IdempotentRequest
from conversations.models import Contact, Conversation, ConversationState
from delivery.models import ScheduledMessage
from tests.conftest import wait_until
from tests.support import local_http
from tools.models import ActionClaim, CalendarEvent

pytestmark = pytest.mark.e2e
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}
GATED = {"AGENTLOOP_EXTRA_TOOLS": "tests.support.tools_for_tests.CreateEventAtGate"}


@pytest.fixture
def shop(make_channel):
    return make_channel("shop")


@pytest.fixture
def conversation(shop, make_conversation):
    return make_conversation(shop, "ana")


@pytest.fixture
def key(shop, agent_key):
    return agent_key(shop)


def post(web, key, path, body, idempotency_key=None, timeout=30):
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return local_http.post(f"{web.url}/api/v1/{path}", json=body, headers=headers, timeout=timeout)


def test_a_retried_tool_invocation_runs_once_and_answers_the_first_answer(processes, key, conversation):
    web = processes.web()
    body = {"conversation": conversation.pk, "arguments": EVENT}
    first = post(web, key, "tools/calendar_create_event/invoke", body, "book-ana-1")
    again = post(web, key, "tools/calendar_create_event/invoke", body, '"book-ana-1"')  # the draft's sf-string
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["status"] == "done"
    assert again.content == first.content  # the first answer, not the guard's "duplicate"
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert again.headers["content-type"] == first.headers["content-type"]
    assert CalendarEvent.objects.count() == 1 and ActionClaim.objects.count() == 1
    # Without the header, the guard alone answers: a duplicate, its note for the model.
    plain = post(web, key, "tools/calendar_create_event/invoke", body)
    assert plain.json()["duplicate"] is True and CalendarEvent.objects.count() == 1


def test_the_same_key_with_another_body_is_422_and_runs_nothing(processes, key, conversation):
    web = processes.web()
    path = "tools/calendar_create_event/invoke"
    assert post(web, key, path, {"conversation": conversation.pk, "arguments": EVENT}, "k1").status_code == 200
    other = post(web, key, path, {"conversation": conversation.pk, "arguments": {**EVENT, "title": "Otra"}}, "k1")
    assert other.status_code == 422, other.text
    assert "another request" in other.json()["error"]
    assert CalendarEvent.objects.count() == 1
    # Another path with the same key is another request too.
    schedule = {"text": "Recordatorio", "due_at": "2030-01-01T10:00:00Z"}
    assert post(web, key, f"conversations/{conversation.pk}/schedules", schedule, "k1").status_code == 422
    assert not ScheduledMessage.objects.exists()


def test_bad_keys_are_400(processes, key, conversation):
    web = processes.web()
    body = {"conversation": conversation.pk, "arguments": EVENT}
    for bad in ("", '""', "x" * 256, '"unterminated'):
        answer = post(web, key, "tools/calendar_create_event/invoke", body, bad)
        assert answer.status_code == 400 and "Idempotency-Key" in answer.json()["error"], (bad, answer.text)
    assert post(web, key, "tools/calendar_create_event/invoke", body, "x" * 255).status_code == 200
    assert CalendarEvent.objects.count() == 1


def test_an_error_answer_is_kept_and_replayed(processes, key, conversation):
    """4xx answers are stored (as Stripe does): the retry gets the same 404, even once the
    conversation exists (only a new key asks again)."""
    web = processes.web()
    body = {"conversation": 999999, "arguments": EVENT}
    first = post(web, key, "tools/calendar_create_event/invoke", body, "missing")
    again = post(web, key, "tools/calendar_create_event/invoke", body, "missing")
    assert first.status_code == again.status_code == 404 and again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"


def test_a_key_in_flight_is_409_and_the_effect_happens_once(processes, key, conversation, tmp_path):
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    web = processes.web(AGENTLOOP_TEST_MARKER=entered, AGENTLOOP_TEST_GATE=gate, **GATED)
    body = {"conversation": conversation.pk, "arguments": EVENT}
    path = "tools/calendar_create_event_at_gate/invoke"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, web, key, path, body, "held")
        wait_until(entered.exists, timeout=20, message="the first request's tool to start")
        second = post(web, key, path, body, "held")
        assert second.status_code == 409, second.text
        assert "in flight" in second.json()["error"] and second.headers.get("retry-after")
        gate.write_text("open")
        first = first.result(timeout=30)
    assert first.status_code == 200 and first.json()["status"] == "done", first.text
    third = post(web, key, path, body, "held")
    assert third.status_code == 200 and third.content == first.content
    assert CalendarEvent.objects.count() == 1


def test_concurrent_requests_with_one_key_make_one_effect(processes, key, conversation):
    """Real parallel requests into two web processes: the first INSERT of the key wins;
    each other is 409 (still in flight) or the replay of the winner's answer."""
    webs = [processes.web(), processes.web()]
    body = {"conversation": conversation.pk, "arguments": EVENT}
    barrier = threading.Barrier(8)

    def call(i):
        barrier.wait()
        return post(webs[i % 2], key, "tools/calendar_create_event/invoke", body, "race")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, range(8)))
    codes = sorted(a.status_code for a in answers)
    assert set(codes) <= {200, 409} and 200 in codes, [a.text for a in answers]
    ran = [a for a in answers if a.status_code == 200 and "idempotent-replayed" not in a.headers]
    assert len(ran) == 1, [a.headers for a in answers]
    assert all(a.content == ran[0].content for a in answers if a.status_code == 200)
    assert CalendarEvent.objects.count() == 1 and ActionClaim.objects.count() == 1
    assert IdempotentRequest.objects.get().status == 200


def test_a_schedule_and_a_takeover_are_replayed(processes, key, conversation, shop, agent_key):
    web = processes.web()
    schedule = {"text": "Tu hora es mañana.", "due_at": "2030-01-01T10:00:00Z"}
    first = post(web, key, f"conversations/{conversation.pk}/schedules", schedule, "sched-1")
    again = post(web, key, f"conversations/{conversation.pk}/schedules", schedule, "sched-1")
    assert first.status_code == again.status_code == 201 and again.content == first.content
    assert ScheduledMessage.objects.count() == 1

    taken = post(web, key, f"conversations/{conversation.pk}/takeover", None, "take-1")
    retried = post(web, key, f"conversations/{conversation.pk}/takeover", None, "take-1")
    assert taken.json()["changed"] is True
    assert retried.status_code == 200 and retried.content == taken.content  # not "changed": false
    assert Conversation.objects.get(pk=conversation.pk).state == ConversationState.PERSON
    # Keys are per agent key: another key's same key is its own request.
    other = agent_key(shop, name="helpdesk")
    fresh = post(web, other, f"conversations/{conversation.pk}/takeover", None, "take-1")
    assert fresh.status_code == 200 and fresh.json()["changed"] is False and "idempotent-replayed" not in fresh.headers


def test_an_operators_erasure_is_replayed(processes, shop):
    get_user_model().objects.create_superuser("olga", "olga@example.com", "pw-olga")
    Contact.objects.create(channel=shop, platform_id="ana", display_name="Ana")
    web = processes.web()

    def forget():
        return local_http.post(f"{web.url}/api/v1/operator/contacts/forget", auth=("olga", "pw-olga"),
                               json={"channel": "shop", "contact": "ana"}, timeout=30,
                               headers={"Idempotency-Key": "forget-ana"})

    first, again = forget(), forget()
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert IdempotentRequest.objects.get().owner.startswith("auth.user:")
