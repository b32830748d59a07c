"""A webhook agent that answers with a stream (docs/streaming.md): newline-delimited JSON
or Server-Sent Events, `{"delta": …}` objects then `{"reply": …}`; previews in the chat,
the reply the ledger sends. A JSON answer still works as ever."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
WORDS = ["Hola, ", "te ", "respondo ", "por ", "partes."]


class StreamingAgent:
    """A local agent service answering a stream of `kind` (ndjson, sse, json), a
    delta every `pace` seconds."""

    def __init__(self, kind, pace=0.35):
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                service.accept = self.headers.get("Accept", "")
                if kind == "json":
                    return self.whole({"reply": "".join(WORDS)})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson" if kind == "ndjson" else "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                items = [{"delta": word} for word in WORDS] + [{"reply": "".join(WORDS)}]
                for index, item in enumerate(items):
                    if index:
                        time.sleep(pace)
                    line = json.dumps(item)
                    self.wfile.write((line + "\n" if kind == "ndjson" else f"data: {line}\n\n").encode())
                    self.wfile.flush()
                if kind == "sse":
                    self.wfile.write(b"data: [DONE]\n\n")

            def whole(self, answer):
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.accept = ""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/agent"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("kind", ["ndjson", "sse", "json"])
def test_a_webhook_agent_may_answer_with_a_stream(processes, make_channel, fake_telegram, kind):
    agent = StreamingAgent(kind)
    try:
        telegram_channel(make_channel, fake_telegram, agent="webhook", extra=UNPACED,
                         agent_config={"url": agent.url, "timeout": 10})
        web, _ = processes.web(wait=False), processes.worker()
        send(web, "tg", 101, "Cuéntame.")
        [final] = fake_telegram.wait_for("sendMessage", timeout=20)
    finally:
        agent.close()
    assert final.params["text"] == "".join(WORDS)
    drafts = fake_telegram.calls("sendMessageDraft")
    assert "application/x-ndjson" in agent.accept and "text/event-stream" in agent.accept
    if kind == "json":
        assert drafts == []
    else:
        assert len(drafts) >= 2 and drafts[0].params["text"].startswith("Hola")
        assert final.at - drafts[0].at >= 1.0


def test_the_web_chat_shows_the_reply_as_it_is_written(processes):
    """The playground's socket on the real web process: `preview` events with the text so
    far, growing, then the `reply`; typing ends with the first preview."""
    import asyncio

    import aiohttp
    from django.contrib.auth.models import User
    from django.test import Client

    from conversations.models import Channel
    from tests.end_to_end.test_typing_modes import started_worker

    text = "uno dos tres cuatro cinco seis siete ocho."
    Channel.objects.create(slug="playground", kind="webchat", agent="echo", agent_config={"stream_pace": 0.15})
    user = User.objects.create_superuser("op", "op@example.com", "pw-op-stream-1")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    web, _ = processes.web(), started_worker(processes)

    async def talk():
        url = web.url.replace("http://", "ws://") + "/ws/console/playground/playground/"
        events = []
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, headers={"Origin": "http://localhost", "Cookie": cookie}) as ws:
            assert (await ws.receive_json(timeout=10))["type"] == "hello"
            await ws.send_json({"text": text})
            while not events or events[-1].get("kind") != "reply":
                message = await ws.receive_json(timeout=20)
                events.append(message.get("event") or {})
        return events

    events = asyncio.run(talk())
    previews = [e["text"] for e in events if e.get("kind") == "preview"]
    assert len(previews) >= 3 and all(p.endswith("▍") for p in previews)
    shown = [p[:-2] for p in previews]
    assert all(text.startswith(p) for p in shown) and shown == sorted(shown, key=len)
    assert events[-1]["text"] == text
    first = next(i for i, e in enumerate(events) if e.get("kind") == "preview")
    assert not [e for e in events[first:] if e.get("kind") == "typing"]
