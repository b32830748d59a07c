"""What other services send back is bounded and never crashes us: a receiver's signature
check refuses a non-ASCII header (instead of raising), a webhook agent's answer over
AGENTLOOP_AGENT_MAX_ANSWER_BYTES is refused with a clear error, and an api channel's
callback that answers 2xx with a body that never ends is delivered, not read whole."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conversations.agents import AgentUnavailable, TurnContext
from conversations.remote_agents import WebhookAgent
from delivery import signing
from delivery.models import Outcome
from delivery.transports import Target

SECRET = "whsec-untrusted-answers-1"


class Answering:
    """A local HTTP server answering every POST with `status` and `body` (bytes), or,
    with `endless`, a chunked 200 whose chunks never stop coming, or, with `hold`, `body`
    with no length and then nothing more for `hold` seconds, the connection kept open
    (`hung_up`: the client closed it meanwhile). `content_type` is the answer's."""

    def __init__(self, body=b"", endless=False, content_type="application/json", hold=0.0):
        self.posts, self.hung_up = 0, threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                service.posts += 1
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                if hold:
                    return self.held()
                if not endless:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 65536
                try:
                    while True:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:
                    pass  # the client stopped reading: what it should do

            def held(self):
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                self.connection.settimeout(hold)
                try:
                    if self.connection.recv(1) == b"":  # no more request: the client closed
                        service.hung_up.set()
                except ConnectionResetError:
                    service.hung_up.set()
                except OSError:
                    pass  # held its time

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def answering():
    servers = []

    def start(**kwargs):
        servers.append(Answering(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_non_ascii_signature_header_is_refused_not_an_error():
    body = b'{"text": "hola"}'
    headers = signing.signed_headers(SECRET, body)
    assert signing.verify(SECRET, headers, body)
    # What a receiver's framework hands over for a forged header (latin-1 decoded bytes).
    forged = {**headers, "X-Agentloop-Signature": "sha256=" + "é" * 64}
    assert signing.verify(SECRET, forged, body) is False
    # Unicode digits pass int(), but are not the timestamp we sign.
    arabic = {**headers, "X-Agentloop-Timestamp": "".join(chr(0x660 + int(d)) for d in headers["X-Agentloop-Timestamp"])}
    assert signing.verify(SECRET, arabic, body) is False


def ask(url, **config):
    ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="hooked", text="hola",
                      config={"url": url, "secret": SECRET, **config})
    return asyncio.run(WebhookAgent().respond(ctx))


def test_a_webhook_agents_answer_over_the_cap_is_refused_with_a_clear_error(answering, settings):
    settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES = 100_000
    small = answering(body=json.dumps({"reply": "Listo."}).encode())
    assert ask(small.url) == "Listo."
    large = answering(body=json.dumps({"reply": "a" * 200_000}).encode())
    with pytest.raises(AgentUnavailable, match=r"more than 100000 bytes.*AGENTLOOP_AGENT_MAX_ANSWER_BYTES"):
        ask(large.url)
    endless = answering(endless=True)
    with pytest.raises(AgentUnavailable, match="more than 100000 bytes"):  # at the cap, not the deadline
        ask(endless.url, timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_callback_answering_an_endless_body_is_delivered_without_reading_it(answering, make_channel, settings):
    settings.AGENTLOOP_CALLBACK_TIMEOUT = 3.0
    endless = answering(endless=True)
    channel = make_channel("shop", platform_settings={"callback_url": endless.url, "callback_secret": SECRET})

    async def send():
        return await channel.platform.transport(channel).send_text(Target(chat_id="ana"), "Su hora es el lunes.")

    result = asyncio.run(send())  # reading the body would end at the deadline: ambiguous
    assert result.outcome == Outcome.DELIVERED, result
    assert endless.posts == 1
