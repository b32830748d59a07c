"""The fake Send API itself (tests/fakes/graph_messenger.py): Graph's documented limits and
error bodies, so the product's tests against it mean what they say. Plain httpx, the
client the product's transport uses."""

import httpx
import pytest

from tests.fakes.graph_messenger import FakeMetaGraph

PAGE, IG, TOKEN, PSID = "1045", "1784", "EAAG-fake", "6645"


@pytest.fixture
def fake():
    with FakeMetaGraph(tokens=[TOKEN], accounts={PAGE: "messenger", IG: "instagram"}) as server:
        yield server


def post(fake, account, body, token=TOKEN):
    return httpx.post(f"{fake.url}/v23.0/{account}/messages", json=body, timeout=5,
                      headers={"Authorization": f"Bearer {token}"} if token else {})


def text(value, **extra):
    return {"recipient": {"id": PSID}, "messaging_type": "RESPONSE", "message": {"text": value}, **extra}


def test_a_message_gets_its_mid_and_a_sender_action_its_recipient(fake):
    sent = post(fake, PAGE, text("hola")).json()
    assert sent["recipient_id"] == PSID and sent["message_id"].startswith("m_")
    assert post(fake, PAGE, {"recipient": {"id": PSID}, "sender_action": "typing_on"}).json() == {"recipient_id": PSID}
    assert len(post(fake, IG, text("hola")).json()["message_id"]) > 120  # Instagram's long mids


@pytest.mark.parametrize("account, body, says", [
    (PAGE, text("a" * 2001), "less than or equal to 2000"),
    (IG, text("ñ" * 501), "less than or equal to 1000"),  # 1,002 bytes
    (PAGE, {"recipient": {"id": PSID}, "message": {"text": "x"}}, "messaging_type"),
    (PAGE, text("x", messaging_type="MESSAGE_TAG"), "tag"),
    (IG, text("x", messaging_type="MESSAGE_TAG", tag="ACCOUNT_UPDATE"), "tag"),
    (PAGE, {**text("x"), "sender_action": "typing_on"}, "sender_action cannot be sent with message"),
    (PAGE, {"recipient": {"id": PSID}, "messaging_type": "RESPONSE",
            "message": {"text": "x", "quick_replies": [{"content_type": "text", "title": "t" * 21, "payload": "p"}]}},
     "quick_replies"),
])
def test_what_the_send_api_refuses_is_a_100_in_the_graph_envelope(fake, account, body, says):
    answer = post(fake, account, body)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == 100 and says in error["message"]
    assert error["type"] == "OAuthException" and error["fbtrace_id"]


def test_tokens_the_window_blocked_people_and_the_rate_are_kept(fake):
    assert post(fake, PAGE, text("x"), token="").json()["error"]["code"] == 190
    assert post(fake, PAGE, text("x"), token="other").json()["error"]["code"] == 190
    fake.strict_window = True
    refused = post(fake, PAGE, text("x")).json()["error"]
    assert (refused["code"], refused["error_subcode"]) == (10, 2018278)
    assert post(fake, PAGE, text("x", messaging_type="MESSAGE_TAG", tag="HUMAN_AGENT")).json()["error"]["code"] == 10
    fake.user_wrote(PSID)
    assert post(fake, PAGE, text("x")).status_code == 200
    fake.block(PSID)
    blocked = post(fake, IG, text("x")).json()["error"]
    assert (blocked["code"], blocked["error_subcode"]) == (551, 1545041)
    fake.blocked.clear()
    fake.per_second = 1
    post(fake, PAGE, text("x"))
    flood = post(fake, PAGE, text("x"))
    assert flood.json()["error"]["code"] == 613
    assert '"estimated_time_to_regain_access": 1' in flood.headers["x-business-use-case-usage"]


def test_instagram_takes_no_uploads(fake):
    answer = httpx.post(f"{fake.url}/v23.0/{IG}/messages", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"},
                        data={"recipient": '{"id": "6645"}', "messaging_type": "RESPONSE",
                              "message": '{"attachment": {"type": "image", "payload": {"is_reusable": false}}}'},
                        files={"filedata": ("a.png", b"\x89PNG", "image/png")})
    assert answer.status_code == 400 and "not supported on Instagram" in answer.json()["error"]["message"]
