"""GET /api/v1/conversations/<id>/messages: a conversation's inbound messages and
replies for agent keys, paginated by an opaque cursor, with a long-poll.

The view is async and reads in the event loop's thread pool, so in-process tests use
committed rows (transactional_db); the long-poll and its cap run against the real web
server and worker processes."""

import os
import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from conversations.models import Conversation, InboundMessage
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.conftest import is_postgres, wait_until
from tests.support import local_http

POST_URL = "/api/v1/channels/{}/messages"
READ_URL = "/api/v1/conversations/{}/messages"
FAST = {"window_closed": 0.1, "window_greeting": 0.1, "window_open": 0.1, "window_neutral": 0.1}


@pytest.fixture
def shop(transactional_db, make_channel):
    return make_channel("shop", kind="api")


@pytest.fixture
def key(shop, agent_key):
    return agent_key(shop, name="shop-app")


def auth(key):
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def post(client, key, message_id, text, slug="shop", contact="ana"):
    response = client.post(POST_URL.format(slug), data={"message_id": message_id, "contact": contact, "text": text},
                           content_type="application/json", **auth(key))
    assert response.status_code == 202, response.content
    return response.json()


def read(client, key, conversation, expect=200, **params):
    response = client.get(READ_URL.format(conversation), params, **auth(key))
    assert response.status_code == expect, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()


def reply(conversation_id, text, **fields):
    row = ledger.enqueue(Conversation.objects.get(pk=conversation_id), text, kind=OutboundKind.REPLY)
    if fields:
        OutboundMessage.objects.filter(pk=row.pk).update(**fields)
    return row


def read_all(client, key, conversation, limit, cursor="", between=None):
    """Page through everything; `between(page_number)` may insert rows between pages."""
    seen, page = [], 0
    while True:
        body = read(client, key, conversation, limit=limit, **({"after": cursor} if cursor else {}))
        seen += [(item["kind"], item["id"]) for item in body["items"]]
        if not body["items"]:
            assert body["next"] == cursor or not cursor, "an empty page keeps the cursor"
            return seen, body["next"]
        assert len(body["items"]) <= limit
        cursor, page = body["next"], page + 1
        if between:
            between(page)


def test_the_post_answer_names_the_conversation_to_read(client, key):
    admitted = post(client, key, "m1", "hola")
    assert admitted["conversation"] == Conversation.objects.get().pk
    assert admitted["disposition"] == "buffered"


def test_inbound_and_replies_in_order_with_ledger_state(client, key):
    conversation = post(client, key, "m1", "hola")["conversation"]
    post(client, key, "m2", "¿me confirmas la hora?")
    first = reply(conversation, "Hola Ana", state=OutboundState.DELIVERED, delivered_at=timezone.now())
    second = reply(conversation, "Tu hora es el lunes", state=OutboundState.DELIVERED, needs_marker=True, attempts=2)

    body = read(client, key, conversation)
    assert body["conversation"] == conversation
    assert [(i["kind"], i["text"]) for i in body["items"]] == [
        ("inbound", "hola"), ("inbound", "¿me confirmas la hora?"), ("reply", "Hola Ana"),
        ("reply", "Tu hora es el lunes")]
    hola, _, answer, recovered = body["items"]
    assert (hola["message_id"], hola["disposition"], hola["state"]) == ("m1", "buffered", None)
    assert (answer["id"], answer["state"], answer["reply_kind"], answer["recovered"]) == (
        first.pk, "delivered", "reply", False)
    assert answer["message_id"] is None and answer["delivered_at"]
    assert (recovered["id"], recovered["recovered"], recovered["attempts"]) == (second.pk, True, 2)


def test_an_inbound_and_a_reply_of_the_same_microsecond_come_once_each_inbound_first(client, key):
    conversation = post(client, key, "m1", "hola")["conversation"]
    instant = InboundMessage.objects.get().received_at
    rows = [reply(conversation, f"r{n}", created_at=instant) for n in range(2)]
    seen, _ = read_all(client, key, conversation, limit=1)
    assert seen == [("inbound", InboundMessage.objects.get().pk)] + [("reply", r.pk) for r in rows]


def test_pages_neither_repeat_nor_skip_with_inserts_between(client, key):
    conversation = post(client, key, "m0", "hola")["conversation"]
    for n in range(4):
        reply(conversation, f"early {n}")
    late = []

    def insert(page):
        if page == 1:  # a row stamped before the rows already read, committed only now
            late.append(reply(conversation, "late commit", created_at=timezone.now() - timedelta(seconds=2)))
        if page == 2:
            post(client, key, f"m{page}", f"more {page}")
            late.append(reply(conversation, f"new {page}"))

    seen, cursor = read_all(client, key, conversation, limit=2, between=insert)
    every = [("inbound", pk) for pk in InboundMessage.objects.values_list("pk", flat=True)] + [
        ("reply", pk) for pk in OutboundMessage.objects.values_list("pk", flat=True)]
    assert len(seen) == len(set(seen)) == 8, "no item twice"
    assert set(seen) == set(every), "none skipped"
    assert ("reply", late[0].pk) in seen

    newer = reply(conversation, "after the end")  # polling on from the last cursor
    assert [i["id"] for i in read(client, key, conversation, after=cursor)["items"]] == [newer.pk]


def test_a_cursor_past_the_settle_time_stays_short(client, key):
    conversation = post(client, key, "m0", "hola")["conversation"]
    for n in range(5):
        reply(conversation, f"old {n}", created_at=timezone.now() - timedelta(minutes=5))
    body = read(client, key, conversation, limit=50)
    assert len(body["items"]) == 6 and len(body["next"]) < 120, "settled rows are behind the boundary, not listed"


@pytest.mark.parametrize("header", [None, "Bearer nope", "Token abc"])
def test_without_a_valid_key_401(client, key, header):
    conversation = post(client, key, "m1", "hola")["conversation"]
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.get(READ_URL.format(conversation), **extra)
    assert response.status_code == 401 and "error" in response.json()


def test_another_channels_conversation_is_not_found(client, key, make_channel, agent_key):
    conversation = post(client, key, "m1", "hola")["conversation"]
    other = agent_key(make_channel("other", kind="api"), name="other-app")
    body = read(client, other, conversation, expect=404)
    assert set(body) == {"error"}
    assert read(client, key, 999_999, expect=404) == {"error": "no conversation 999999"}


@pytest.mark.parametrize("params, field", [
    ({"after": "not-a-cursor"}, "after"), ({"after": "eyJiIjpudWxsfQ"}, "after"), ({"after": "x" * 5000}, "after"),
    ({"limit": 0}, "limit"), ({"limit": 201}, "limit"), ({"limit": "many"}, "limit"),
    ({"wait": 31}, "wait"), ({"wait": -1}, "wait"),
])
def test_bad_parameters_are_400(client, key, params, field):
    conversation = post(client, key, "m1", "hola")["conversation"]
    body = read(client, key, conversation, expect=400, **params)
    assert body["error"] == "invalid request" and field in body["fields"]


def test_the_limit_bounds_a_page(client, key):
    conversation = post(client, key, "m1", "hola")["conversation"]
    for n in range(60):
        reply(conversation, f"r{n}")
    assert len(read(client, key, conversation)["items"]) == 50
    assert len(read(client, key, conversation, limit=200)["items"]) == 61


def test_the_schema_documents_the_operation(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = schema["paths"]["/api/v1/conversations/{conversation}/messages"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert params["conversation"]["in"] == "path" and params["conversation"]["required"]
    assert params["after"]["schema"] == {"type": "string", "format": "cursor"}  # opaque: a `next` passed back
    assert (params["limit"]["schema"]["minimum"], params["limit"]["schema"]["maximum"],
            params["limit"]["schema"]["default"]) == (1, 200, 50)
    assert (params["wait"]["schema"]["minimum"], params["wait"]["schema"]["maximum"]) == (0, 30)
    responses = operation["responses"]
    for code in ("400", "401", "403", "404", "429", "503"):
        assert responses[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    page = responses["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][page]["required"]) == {"conversation", "items", "next"}


# --- the real web server and worker ------------------------------------------------------


def http_read(web, key, conversation, timeout=40, **params):
    return local_http.get(f"{web.url}{READ_URL.format(conversation)}", params=params,
                     headers={"Authorization": f"Bearer {key}"}, timeout=timeout)


@pytest.mark.e2e
def test_long_poll_gets_the_reply_of_an_api_channel_without_callback(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", **FAST), name="shop-app")
    web = processes.web(wait=False)
    admitted = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                          json={"message_id": "m1", "contact": "ana", "text": "hola"}, timeout=10).json()
    first = http_read(web, key, admitted["conversation"]).json()
    assert [i["kind"] for i in first["items"]] == ["inbound"]
    # The worker only now: with it running, its 0.1 s window could close and the reply
    # be written before the first read (a loaded CI machine did that once).
    processes.worker()

    started = time.monotonic()
    answer = http_read(web, key, admitted["conversation"], wait=25, after=first["next"])
    elapsed, answered_at = time.monotonic() - started, timezone.now()
    assert answer.status_code == 200, answer.text
    [item] = answer.json()["items"]
    assert item["kind"] == "reply" and item["text"] and item["state"] in OutboundState.values
    assert elapsed < 10, f"the reply took {elapsed:.1f}s (window 0.1 s + an echo turn)"
    row = OutboundMessage.objects.get(pk=item["id"])
    assert item["text"] == row.text
    lag = (answered_at - row.created_at).total_seconds()
    print(f"long-poll answered {lag:.3f}s after the reply row was written")
    assert lag < 1.5, "checks are at most 0.5 s apart"
    # The stored transport records it delivered: re-read from the start shows the state now.
    wait_until(lambda: OutboundMessage.objects.get(pk=row.pk).state == OutboundState.DELIVERED, message="delivered")
    again = http_read(web, key, admitted["conversation"]).json()["items"]
    assert [(i["kind"], i.get("state")) for i in again] == [("inbound", None), ("reply", "delivered")]


@pytest.mark.e2e
def test_long_poll_times_out_empty_with_the_same_cursor_and_is_capped(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", agent="pull"), name="shop-app")  # nobody answers
    web = processes.web(AGENTLOOP_MAX_LONG_POLLS=1)
    conversation = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                              json={"message_id": "m1", "contact": "ana", "text": "hola"}, timeout=10
                              ).json()["conversation"]
    cursor = http_read(web, key, conversation).json()["next"]

    waiting = {}

    def long_poll():
        started = time.monotonic()
        waiting["answer"] = http_read(web, key, conversation, wait=2, after=cursor)
        waiting["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=long_poll)
    thread.start()
    time.sleep(0.5)  # the first long-poll is waiting (the server answers it after 2 s)
    refused = http_read(web, key, conversation, wait=2, after=cursor)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "2" and "error" in refused.json()
    # A read that does not wait is never refused.
    assert http_read(web, key, conversation, after=cursor).status_code == 200
    thread.join(10)

    assert waiting["answer"].status_code == 200
    assert waiting["answer"].json() == {"conversation": conversation, "items": [], "next": cursor}
    assert 2.0 <= waiting["elapsed"] < 4.0
    assert http_read(web, key, conversation, wait=0.2, after=cursor).status_code == 200, "the slot was given back"


@pytest.mark.e2e
def test_real_server_errors_are_json(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api"), name="shop-app")
    other = agent_key(make_channel("other", kind="api"), name="other-app")
    web = processes.web()
    conversation = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                              json={"message_id": "m1", "contact": "ana", "text": "hola"}, timeout=10
                              ).json()["conversation"]
    for response, code in [(http_read(web, "wrong", conversation), 401), (http_read(web, other, conversation), 404),
                           (http_read(web, key, 999_999), 404), (http_read(web, key, conversation, after="zz"), 400),
                           (http_read(web, key, conversation, limit=500), 400),
                           (http_read(web, key, conversation, wait=60), 400)]:
        assert response.status_code == code, response.text
        assert response.headers["Content-Type"] == "application/json" and "error" in response.json()


def test_other_methods_go_through_drf(client, key):
    conversation = post(client, key, "m1", "hola")["conversation"]
    refused = client.post(READ_URL.format(conversation), **auth(key))
    assert refused.status_code == 405 and "error" in refused.json()
    assert client.head(READ_URL.format(conversation), **auth(key)).status_code == 200
    assert client.options(READ_URL.format(conversation), **auth(key)).status_code == 200


def test_a_burst_beyond_the_cursor_memory_still_pages_exactly_once(client, key):
    conversation = post(client, key, "m0", "hola")["conversation"]
    for n in range(150):  # all within the settle time: the cursor keeps at most 100 of them
        reply(conversation, f"r{n}")
    seen, cursor = read_all(client, key, conversation, limit=40)
    assert len(seen) == len(set(seen)) == 151
    assert len(cursor) < 4096


def threads_of(pid):
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def connections_to_test_database():
    from django.db import connection

    if not is_postgres():
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.e2e
def test_waiting_long_polls_hold_no_thread_and_no_connection_each(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", agent="pull"), name="shop-app")
    web = processes.web()
    conversation = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                              json={"message_id": "m1", "contact": "ana", "text": "hola"}, timeout=10
                              ).json()["conversation"]
    cursor = http_read(web, key, conversation).json()["next"]
    http_read(web, key, conversation, wait=0.3, after=cursor)  # the pool's threads exist before the baseline
    threads_before, connections_before = threads_of(web.pid), connections_to_test_database()

    clients, answers = 40, []
    polls = [threading.Thread(target=lambda: answers.append(http_read(web, key, conversation, wait=5, after=cursor)))
             for _ in range(clients)]
    for poll in polls:
        poll.start()
    time.sleep(1.2)  # all waiting, checking every 0.5 s by now
    samples = []
    for _ in range(25):
        samples.append((threads_of(web.pid) - threads_before, connections_to_test_database() - connections_before))
        time.sleep(0.1)
    for poll in polls:
        poll.join(15)
    assert len(answers) == clients and all(a.status_code == 200 and not a.json()["items"] for a in answers)
    pool = min(32, (os.cpu_count() or 1) + 4)  # the event loop's default thread pool
    # The fewest seen while all wait: on a loaded machine a late request's own middleware
    # thread (or one shutting down) can still be there at one sample; a thread held per
    # waiting client would be there at every sample (+40).
    extra_threads, extra_connections = min(t for t, _ in samples), min(c for _, c in samples)
    print(f"{clients} waiting long-polls: +{extra_threads} threads, +{extra_connections} database connections")
    assert extra_threads <= pool + 2 < clients
    assert extra_connections <= pool < clients


@pytest.mark.e2e
def test_a_client_that_hangs_up_gives_its_slot_back(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", agent="pull"), name="shop-app")
    web = processes.web(AGENTLOOP_MAX_LONG_POLLS=1)
    conversation = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                              json={"message_id": "m1", "contact": "ana", "text": "hola"}, timeout=10
                              ).json()["conversation"]
    cursor = http_read(web, key, conversation).json()["next"]
    with pytest.raises(httpx.ReadTimeout):
        http_read(web, key, conversation, wait=25, after=cursor, timeout=0.5)
    wait_until(lambda: http_read(web, key, conversation, wait=0.1, after=cursor).status_code == 200,
               timeout=5, message="the hung-up long-poll's slot freed")
