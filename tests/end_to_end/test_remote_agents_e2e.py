"""Pull and webhook agents complete turns through the API, with the real web server and
worker processes; the webhook agent is a small local HTTP service checking our signature."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conversations.models import Turn, TurnState
from delivery import attachments, signing
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.support import local_http

pytestmark = pytest.mark.e2e
SECRET = "agent-secret"


def api(web, key, method, path, body=None):
    return local_http.request(method, f"{web.url}{path}", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {key}"})


def inbound(web, key, slug, message_id, text, contact="ana"):
    response = api(web, key, "POST", f"/api/v1/channels/{slug}/messages",
                   {"message_id": message_id, "contact": contact, "text": text})
    assert response.status_code == 202, response.text


def delivered_texts():
    return list(OutboundMessage.objects.filter(state=OutboundState.DELIVERED).values_list("text", flat=True))


def test_a_pull_agent_claims_replies_and_closes_a_turn(processes, make_channel, agent_key):
    channel = make_channel("pulled", agent="pull")
    key, stranger = agent_key(channel, name="puller"), agent_key(make_channel("other"), name="stranger")
    web, _ = processes.web(wait=False), processes.worker()
    inbound(web, key, "pulled", "m1", "¿Tienen hora el lunes?")
    ready = wait_until(lambda: api(web, key, "GET", "/api/v1/turns?state=ready").json(), timeout=10,
                       message="a ready turn")
    [turn] = ready
    assert turn["text"] == "¿Tienen hora el lunes?" and turn["channel"] == "pulled"
    assert api(web, stranger, "POST", f"/api/v1/turns/{turn['id']}/claim").status_code == 404
    claimed = api(web, key, "POST", f"/api/v1/turns/{turn['id']}/claim")
    assert claimed.status_code == 200 and claimed.json()["state"] == "running"
    assert claimed.json()["history"] == []
    assert api(web, key, "POST", f"/api/v1/turns/{turn['id']}/claim").status_code == 409
    reply_url = f"/api/v1/turns/{turn['id']}/reply"
    # Files in a reply: base64 bytes, refused with a clear error when they are not.
    for files, problem in (([{"name": "a.ics", "data": "%%%"}], "not base64"),
                           ([{"name": "a.ics", "data": ""}], "may not be blank"),
                           ([{"name": "a.ics", "data": "aG9sYQ=="}] * 11, "no more than 10")):
        refused = api(web, key, "POST", reply_url, {"text": "Tu cita:", "files": files})
        assert refused.status_code == 400 and problem in refused.text, refused.text
    assert api(web, key, "POST", reply_url, {"files": []}).status_code == 400  # a reply has a text
    assert api(web, key, "POST", reply_url, {"text": "Sí, a las 10.", "files": [
        {"name": "cita.ics", "data": base64.b64encode(b"BEGIN:VCALENDAR").decode(), "caption": "Tu cita"}]}
               ).status_code == 202
    with_file = OutboundMessage.objects.get(text="Sí, a las 10.")
    [text, document] = with_file.chunks
    assert text == "Sí, a las 10." and document["files"][0]["name"] == "cita.ics"
    assert attachments.read(document["files"][0]["file"]) == b"BEGIN:VCALENDAR"
    done = api(web, key, "POST", f"/api/v1/turns/{turn['id']}/done", {"text": "¿Te la reservo?"})
    assert done.status_code == 200 and done.json()["state"] == "done"
    assert api(web, key, "POST", f"/api/v1/turns/{turn['id']}/done").status_code == 200  # retried: harmless
    assert api(web, key, "POST", f"/api/v1/turns/{turn['id']}/reply", {"text": "late"}).status_code == 409
    wait_until(lambda: len(delivered_texts()) == 2, message="both replies delivered")
    assert sorted(delivered_texts()) == ["Sí, a las 10.", "¿Te la reservo?"]
    assert Turn.objects.get().reply_text == "Sí, a las 10.\n¿Te la reservo?"


def test_a_claimed_pull_turn_never_finished_is_released(processes, make_channel, agent_key):
    channel = make_channel("pulled", agent="pull")
    key = agent_key(channel)
    web, _ = processes.web(wait=False), processes.worker(AGENTLOOP_EXTERNAL_TURN_TIMEOUT="1")
    inbound(web, key, "pulled", "m1", "hola?")
    [turn] = wait_until(lambda: api(web, key, "GET", "/api/v1/turns").json(), timeout=10, message="a ready turn")
    assert api(web, key, "POST", f"/api/v1/turns/{turn['id']}/claim").status_code == 200
    wait_until(lambda: Turn.objects.get().state == TurnState.READY, timeout=15, message="the turn released")
    assert api(web, key, "POST", f"/api/v1/turns/{turn['id']}/claim").status_code == 200  # claimable again


class AgentService:
    """A stand-in for an operator's agent service: checks the signature, then answers
    with the reply at once, or 202 and later through our API."""

    def __init__(self, mode):
        self.mode, self.received = mode, []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                # A receiver's check: HMAC over "<timestamp>.<body>", a recent timestamp.
                if not signing.verify(SECRET, self.headers, body):
                    self.send_response(401)
                    self.end_headers()
                    return
                payload = json.loads(body)
                service.received.append(payload)
                answer = {"reply": f"Recibido: {payload['text']}"} if service.mode == "now" else {}
                data = json.dumps(answer).encode()
                self.send_response(200 if service.mode == "now" else 202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/agent"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["now", "later"])
def test_a_webhook_agent_answers_in_the_response_or_later_through_the_api(processes, make_channel, agent_key,
                                                                          mode):
    service = AgentService(mode)
    try:
        channel = make_channel("hooked", agent="webhook", agent_config={"url": service.url, "secret": SECRET})
        key = agent_key(channel)
        web, _ = processes.web(wait=False), processes.worker()
        inbound(web, key, "hooked", "m1", "¿Abren el sábado?")
        wait_until(lambda: service.received, timeout=10, message="the agent service called")
        [payload] = service.received
        assert payload["text"] == "¿Abren el sábado?" and payload["channel"] == "hooked"
        if mode == "later":
            turn = payload["turn"]
            wait_until(lambda: Turn.objects.get().owner == "agent:webhook", message="the turn handed over")
            assert api(web, key, "POST", payload["reply_url"], {"text": "Sí, de 10 a 14."}).status_code == 202
            assert api(web, key, "POST", f"/api/v1/turns/{turn}/done").status_code == 200
        wait_until(lambda: delivered_texts(), timeout=10, message="the reply delivered")
        expected = "Recibido: ¿Abren el sábado?" if mode == "now" else "Sí, de 10 a 14."
        assert delivered_texts() == [expected]
        assert Turn.objects.get().state == TurnState.DONE
    finally:
        service.close()
