"""The fake Graph API answers like the documented WhatsApp Cloud API (shapes, statuses,
the error envelope), and its scripting (errors, holds, dropped connections) does what
the tests built on it assume. Driven over real HTTP with httpx."""

import json
import threading
import time

import httpx
import pytest

from tests.fakes import graph_api
from tests.fakes.graph_api import FakeGraphAPI
from tests.support import local_http

TOKEN = "EAAG-fake-token-123456"
PHONE = "106540352242922"


@pytest.fixture
def fake():
    with FakeGraphAPI(tokens=[TOKEN], phone_number_ids=[PHONE]) as server:
        yield server


def post(fake, body, token=TOKEN, phone=PHONE, timeout=5.0):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return local_http.post(f"{fake.url}/v23.0/{phone}/messages", json=body, headers=headers, timeout=timeout)


def text(to="16505551234", body="hola", **extra):
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to, "type": "text",
            "text": {"preview_url": False, "body": body}, **extra}


def assert_error_shape(response, code):
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "fbtrace_id"}
    assert error["code"] == code and isinstance(error["message"], str) and error["type"] == "OAuthException"
    return error


def test_a_text_message_answers_the_documented_success_shape(fake):
    response = post(fake, text(context={"message_id": "wamid.ABC"}))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["messaging_product"] == "whatsapp"
    assert body["contacts"] == [{"input": "16505551234", "wa_id": "16505551234"}]
    [message] = body["messages"]
    assert message["id"].startswith("wamid.") and 50 <= len(message["id"]) <= 100
    [call] = fake.calls("message")
    assert call.token == TOKEN and call.phone_number_id == PHONE and call.version == "v23.0"
    assert call.body["context"] == {"message_id": "wamid.ABC"}
    assert fake.texts("16505551234") == ["hola"]


def test_each_send_gets_a_new_wamid(fake):
    ids = {post(fake, text()).json()["messages"][0]["id"] for _ in range(5)}
    assert len(ids) == 5


def test_a_typing_indicator_and_a_read_receipt_answer_success(fake):
    typing = {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.XYZ",
              "typing_indicator": {"type": "text"}}
    assert post(fake, typing).json() == {"success": True}
    read = {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.XYZ"}
    assert post(fake, read).json() == {"success": True}
    assert [c.what for c in fake.calls()] == ["typing", "read"]


@pytest.mark.parametrize("code, status, title", [
    (131047, 400, "Re-engagement message"), (130429, 400, "Rate limit hit"), (190, 401, "Access token has expired"),
    (131000, 500, "Something went wrong"), (2, 503, "API Service"), (131026, 400, "Message Undeliverable"),
])
def test_scripted_errors_use_the_graph_envelope(fake, code, status, title):
    fake.fail_next("message", code=code, subcode=2494010)
    response = post(fake, text())
    assert response.status_code == status
    error = assert_error_shape(response, code)
    assert error["message"] == f"(#{code}) {title}" and error["error_subcode"] == 2494010
    assert error["error_data"]["messaging_product"] == "whatsapp" and error["error_data"]["details"]
    assert post(fake, text()).status_code == 200  # only the next call


def test_scripted_errors_count_down_and_match_their_kind(fake):
    fake.fail_next("message", code=131000, times=2)
    typing = {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.X",
              "typing_indicator": {"type": "text"}}
    assert post(fake, typing).status_code == 200  # not a message: not scripted
    assert [post(fake, text()).status_code for _ in range(3)] == [500, 500, 200]


def test_credentials_and_the_number_are_checked(fake):
    assert_error_shape(post(fake, text(), token=None), 104)
    response = post(fake, text(), token="EAAG-wrong")
    assert response.status_code == 401 and assert_error_shape(response, 190)
    response = post(fake, text(), phone="999")
    assert response.status_code == 400 and assert_error_shape(response, 100)["error_subcode"] == 33


@pytest.mark.parametrize("body, phrase", [
    ({"to": "1", "type": "text", "text": {"body": "x"}}, "messaging_product"),
    (text(body=""), "text['body']"),
    (text(body="x" * 4097), "at most 4096"),
    (text(to=""), "to is required"),
    ({"messaging_product": "whatsapp", "status": "read", "message_id": "nope",
      "typing_indicator": {"type": "text"}}, "message_id"),
])
def test_invalid_bodies_are_refused_like_the_api_does(fake, body, phrase):
    response = post(fake, body)
    assert response.status_code == 400
    assert phrase in assert_error_shape(response, 100)["message"]


def test_4096_characters_are_accepted(fake):
    assert post(fake, text(body="y" * 4096)).status_code == 200


def test_a_held_send_is_recorded_and_answers_only_when_released(fake):
    hold = fake.hold("message")
    answers = []
    thread = threading.Thread(target=lambda: answers.append(post(fake, text(), timeout=10)))
    thread.start()
    hold.wait_held(1)
    assert len(fake.calls("message")) == 1 and answers == []  # received, not answered
    hold.release()
    thread.join(5)
    assert answers[0].status_code == 200


def test_a_held_send_times_the_client_out(fake):
    with fake.hold("message"):
        with pytest.raises(httpx.ReadTimeout):
            post(fake, text(), timeout=0.3)


def test_a_dropped_connection_gives_no_answer(fake):
    fake.drop_connection_next("message")
    with pytest.raises(httpx.RemoteProtocolError):
        post(fake, text())
    assert post(fake, text()).status_code == 200


def test_a_delay_slows_the_answer(fake):
    fake.delay("message", 0.3)
    started = time.monotonic()
    post(fake, text())
    assert time.monotonic() - started >= 0.3


def test_wait_for_blocks_until_the_calls_arrive(fake):
    threading.Timer(0.2, lambda: post(fake, text())).start()
    [call] = fake.wait_for("message", timeout=5)
    assert call.body["to"] == "16505551234"
    with pytest.raises(AssertionError, match="expected 2"):
        fake.wait_for("message", count=2, timeout=0.2)


def test_webhook_bodies_have_the_documented_shape_and_signature():
    message = graph_api.text_message("16505551234", "hola")
    body = graph_api.webhook_body(PHONE, messages=[message],
                                  statuses=[graph_api.status("wamid.A", "failed", "16505551234", error_code=131047)])
    assert body["object"] == "whatsapp_business_account"
    [change] = body["entry"][0]["changes"]
    assert change["field"] == "messages"
    value = change["value"]
    assert value["metadata"]["phone_number_id"] == PHONE
    assert value["contacts"] == [{"profile": {"name": "Camila Rojas"}, "wa_id": "16505551234"}]
    assert value["messages"][0]["text"] == {"body": "hola"} and value["messages"][0]["type"] == "text"
    [failed] = value["statuses"]
    assert failed["errors"][0]["code"] == 131047 and failed["errors"][0]["title"] == "Re-engagement message"
    raw = json.dumps(body).encode()
    # The documented example: sha256= and the lowercase hex HMAC-SHA256 of the raw body.
    import hashlib
    import hmac
    assert graph_api.signature("s3cr3t", raw) == "sha256=" + hmac.new(b"s3cr3t", raw, hashlib.sha256).hexdigest()


# --- the 24-hour window and templates ---------------------------------------------------------


def template(to="16505551234", name="appointment_reminder", code="es", values=("mañana a las 10",)):
    content = {"name": name, "language": {"code": code}}
    if values is not None:
        content["components"] = [{"type": "body", "parameters": [{"type": "text", "text": v} for v in values]}]
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to, "type": "template",
            "template": content}


def test_free_text_outside_the_window_is_131047_and_a_registered_template_goes(fake):
    fake.add_template("appointment_reminder", "es", parameters=1)
    fake.user_wrote("16505551234", at=time.time() - 25 * 3600)
    fake.user_wrote("16505559999")  # wrote just now
    assert_error_shape(post(fake, text()), 131047)
    assert post(fake, text(to="16505559999")).status_code == 200
    assert post(fake, template()).status_code == 200
    assert fake.templates_sent("16505551234") == [template()["template"]]
    strict = FakeGraphAPI(strict_window=True)
    with strict:
        assert_error_shape(post(strict, text(to="1")), 131047)  # never heard from: outside


def test_a_template_is_refused_for_an_unknown_name_or_language_or_another_parameter_count(fake):
    fake.add_template("appointment_reminder", "es", parameters=1)
    unknown = post(fake, template(name="no_such_template"))
    assert unknown.status_code == 404 and "no_such_template" in assert_error_shape(unknown, 132001)["error_data"][
        "details"]
    assert_error_shape(post(fake, template(code="en_US")), 132001)
    count = post(fake, template(values=("uno", "dos")))
    assert count.status_code == 400 and "(2)" in assert_error_shape(count, 132000)["error_data"]["details"]
    assert_error_shape(post(fake, template(values=None)), 132000)
    assert_error_shape(post(fake, template(values=("dos\nlíneas",))), 132018)
    assert post(fake, template(values=("",))).json()["error"]["code"] == 100
    assert fake.templates_sent() == []


def test_deliver_notes_when_the_user_wrote(fake):
    fake.user_wrote("5491100000000", at=time.time() - 30 * 3600)
    message = graph_api.text_message("5491100000000", "hola")
    with FakeGraphAPI() as webhook_sink:  # any server answering a POST: here, a second fake
        fake.deliver(f"{webhook_sink.url}/hook", graph_api.webhook_body(PHONE, messages=[message]), "secret")
    assert post(fake, text(to="5491100000000")).status_code == 200
