"""The read API's SSE stream (conversations/api/streaming.py) end to end: the real web
server (daphne) and worker, an api channel whose echo agent writes a word every 0.25 s.
An SSE client (httpx, streamed) sees the turn's deltas before the reply event, whose
item is the ledger row as the read API shows it. Keys, scoping, the cap per key, the
deadline and the keep-alive."""

import json
import threading
import time

import httpx
import pytest

from delivery.models import OutboundMessage
from tests.conftest import wait_until
from tests.end_to_end.test_api_read import FAST, POST_URL, http_read
from tests.support import local_http

pytestmark = pytest.mark.e2e
STREAM_URL = "/api/v1/conversations/{}/stream"
WORDS = " ".join(f"palabra{i}" for i in range(10))  # 10 words, 0.25 s apart


def post_message(web, key, text, message_id="m1"):
    answer = local_http.post(f"{web.url}{POST_URL.format('shop')}", headers={"Authorization": f"Bearer {key}"},
                             json={"message_id": message_id, "contact": "ana", "text": text}, timeout=10)
    assert answer.status_code == 202, answer.text
    return answer.json()["conversation"]


def past_the_reply(web, key, conversation):
    cursor, replied = "", False
    deadline = time.monotonic() + 20
    while not replied and time.monotonic() < deadline:
        page = http_read(web, key, conversation, wait=5, after=cursor).json()
        cursor, replied = page["next"], any(item["kind"] == "reply" for item in page["items"])
    assert replied, "the first message answered"
    return cursor


def events(response):
    """(name, data, id, at) of each event of an open SSE response, as it arrives; comments
    as ("comment", text, "", at)."""
    name, data, event_id = "", [], ""
    for line in response.iter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip(), "", time.monotonic()
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line == "" and name:
            yield name, json.loads("\n".join(data)), event_id, time.monotonic()
            name, data, event_id = "", [], ""


def stream(web, key, conversation, **params):
    return httpx.stream("GET", f"{web.url}{STREAM_URL.format(conversation)}", params=params, timeout=30,
                        headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}, trust_env=False)


def test_deltas_then_the_reply_row_as_the_read_api_shows_it(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", agent="echo", agent_config={"stream_pace": 0.25}, **FAST),
                    name="shop-app")
    web, _ = processes.web(wait=False), processes.worker()
    conversation = post_message(web, key, "hola")
    cursor = past_the_reply(web, key, conversation)  # "hola" answered: the stream starts after it
    seen = []
    with stream(web, key, conversation, after=cursor) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for name, data, event_id, at in events(response):
            if name == "comment":
                if data == "stream open":
                    post_message(web, key, WORDS, "m2")  # the stream listens: now the turn
                continue
            seen.append((name, data, event_id, at))
            if name == "end":
                break
    names = [name for name, *_ in seen]
    deltas = [data for name, data, *_ in seen if name == "delta"]
    assert names[0] == "inbound" and names[-2:] == ["reply", "end"], names
    assert len(deltas) >= 2 and names.index("reply") > names.index("delta")
    assert seen[names.index("reply")][3] - seen[names.index("delta")][3] >= 1.0  # deltas came as it was written
    text = ""
    for delta in deltas:
        assert delta["offset"] == len(text)
        text += delta["text"]
    reply = seen[names.index("reply")][1]
    row = OutboundMessage.objects.get(pk=reply["id"])
    assert reply["text"] == row.text == WORDS
    assert WORDS.startswith(text) and len(text) > len("palabra0")  # the last words may come with the reply only
    # Exactly as the read API shows it (its delivery read after, so compared without it:
    # the row may have been claimed, attempted and delivered since the event).
    [shown] = [item for item in http_read(web, key, conversation, after=cursor).json()["items"]
               if item["kind"] == "reply"]
    progress = {"state": None, "delivered_at": None, "attempts": None}
    assert {**reply, **progress} == {**shown, **progress}
    # The end's cursor is past the reply: a stream from it starts after this turn.
    assert seen[-1][1]["next"] == seen[-1][2]
    after = http_read(web, key, conversation, after=seen[-1][1]["next"]).json()
    assert after["items"] == []


def test_keys_scope_the_cap_per_key_and_the_deadline_with_keep_alives(processes, make_channel, agent_key):
    key = agent_key(make_channel("shop", kind="api", agent="pull"), name="shop-app")  # nobody answers
    other = agent_key(make_channel("other", kind="api"), name="other-app")
    web = processes.web(AGENTLOOP_MAX_STREAMS_PER_KEY=1, AGENTLOOP_SSE_HEARTBEAT=0.3)
    conversation = post_message(web, key, "hola")
    url = f"{web.url}{STREAM_URL.format(conversation)}"
    assert local_http.get(url, timeout=10).status_code == 401
    assert local_http.get(url, headers={"Authorization": f"Bearer {other}"}, timeout=10).status_code == 404
    assert local_http.get(url, params={"wait": 0}, headers={"Authorization": f"Bearer {key}"},
                          timeout=10).status_code == 400
    head = local_http.request("HEAD", url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
    opened, got = threading.Event(), []

    def hold_one():
        with stream(web, key, conversation, wait=2) as response:
            for item in events(response):
                opened.set()
                got.append(item)

    holder = threading.Thread(target=hold_one)
    holder.start()
    assert opened.wait(10)
    second = local_http.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert second.status_code == 429 and second.headers["Retry-After"] == "2"
    assert second.headers["content-type"] == "application/json"
    holder.join(15)
    names = [name for name, *_ in got]
    assert names[-1] == "end" and "inbound" in names and "reply" not in names
    assert sum(1 for name, data, *_ in got if name == "comment" and data == "keep-alive") >= 3
    assert got[-1][3] - got[0][3] >= 1.5  # open until its deadline
    # The slot came back when the stream ended.
    wait_until(lambda: local_http.get(url, params={"wait": 1}, headers={"Authorization": f"Bearer {key}"},
                                      timeout=10).status_code == 200, timeout=5, message="the slot freed")


def test_the_schema_describes_the_stream(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/conversations/{conversation}/stream"]["get"]
    assert list(operation["responses"]["200"]["content"]) == ["text/event-stream"]
    assert {p["name"] for p in operation["parameters"]} == {"conversation", "after", "wait"}
    assert all(list(operation["responses"][code]["content"]) == ["application/json"]
               for code in ("400", "401", "403", "404", "429", "503"))
