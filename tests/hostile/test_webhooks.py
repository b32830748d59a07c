"""Hostile input at the platforms' inbound URLs (docs/security.md): what a person in a
chat, or anyone who can reach a webhook URL, can send, and what holds.

Per-person limits (issue 51, finding 1): a turn the person cancels with `/stop` cost the
agent all the same, so it counts against the hour's turns and the day's tokens, and a
stream cut before the provider said its usage is charged an estimate of what it read and
wrote. Through the real web server, worker, fake Bot API and fake OpenAI-compatible
provider (the openai SDK streaming from it)."""

import select
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from conversations import limits
from conversations.models import InboundMessage, Turn, TurnState
from tests.conftest import wait_until
from tests.end_to_end.test_guard_e2e import operator_session
from tests.fakes.openai_api import FakeOpenAI, Reply
from tests.support import local_http
from tests.support.e2e import UNPACED, send, telegram_channel
from tests.support.whatsapp import whatsapp_channel

pytestmark = pytest.mark.e2e
CHAT = 101
# 40 pieces 0.2 s apart: 8 s of writing, time enough to /stop it half-way.
SLOW = Reply(" ".join(f"palabra{i}" for i in range(40)), pace=0.2)


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


def model_channel(make_channel, fake_telegram, fake_openai, stream, **limits_):
    return telegram_channel(make_channel, fake_telegram, agent="openai", extra=UNPACED, agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY",
        "stream": stream}, **limits_)


def sent_texts(fake_telegram):
    return [c.params["text"] for c in fake_telegram.calls("sendMessage") if int(c.params["chat_id"]) == CHAT]


def stopped_while_the_model_answers(web, fake_telegram, fake_openai, started):
    """A message whose turn reaches the model, then `/stop` while the model still answers."""
    send(web, "tg", CHAT, "Cuéntame todo sobre mis horas de psicología.")
    wait_until(started, timeout=15, message="the model answering")
    send(web, "tg", CHAT, "/stop")
    return wait_until(lambda: Turn.objects.filter(state=TurnState.CANCELLED).first(), timeout=15,
                      message="the turn cancelled by /stop")


def test_a_turn_stopped_while_the_model_answers_counts_against_the_hour(processes, make_channel, fake_telegram,
                                                                        fake_openai):
    model_channel(make_channel, fake_telegram, fake_openai, stream=False, turns_per_contact_per_hour=1)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    hold = fake_openai.hold()
    stopped_while_the_model_answers(web, fake_telegram, fake_openai, lambda: hold.held)
    hold.release()

    send(web, "tg", CHAT, "Otra pregunta.")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1, "the stopped turn was the hour's one turn: no second model request"


def test_a_finished_stream_spends_the_usage_the_provider_reports(processes, make_channel, fake_telegram,
                                                                 fake_openai):
    fake_openai.script(Reply("Primera respuesta, larga y completa."))
    model_channel(make_channel, fake_telegram, fake_openai, stream=True, tokens_per_contact_per_day=20)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    send(web, "tg", CHAT, "Hola, una consulta larga sobre mis horas de psicología.")
    wait_until(lambda: Turn.objects.filter(state=TurnState.DONE).exists(), timeout=15, message="the streamed turn")
    assert fake_openai.requests()[0].body["stream_options"] == {"include_usage": True}
    assert Turn.objects.get().tokens_used >= 20, "the usage the provider sent after the stream's last chunk"

    send(web, "tg", CHAT, "¿Y otra cosa?")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1


def test_a_stream_stopped_half_way_is_charged_and_counts(processes, make_channel, fake_telegram, fake_openai):
    fake_openai.script(SLOW)
    model_channel(make_channel, fake_telegram, fake_openai, stream=True, tokens_per_contact_per_day=20)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    turn = stopped_while_the_model_answers(web, fake_telegram, fake_openai, lambda: fake_openai.streamed_chunks >= 5)
    # The provider never said its usage (the stream was cut before its end): the turn is
    # charged an estimate of the prompt it read and the text it wrote.
    wait_until(lambda: Turn.objects.get(pk=turn.pk).tokens_used >= 20, timeout=10, message="the cut stream charged")

    send(web, "tg", CHAT, "Sigue, por favor.")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1, "the stopped stream spent the day's budget: no second model request"


# --- One body limit at the server (issue 51, finding 7) ------------------------------------
# Django's ASGI handler spooled a whole body to a temporary file (on disk past 2.5 MB)
# before it routed or authenticated anything, and a chunked body declares no length: one
# unauthenticated POST filled the disk. Now the web server refuses a body past its
# route's limit before it is read further. What the server process read and wrote is its
# own count (/proc/<pid>/io: every read and write call, sockets and files alike).

ENDLESS = 16 * 1024 * 1024  # far past the 2.5 MB Django keeps in memory before it spools to disk
PIECE = 64 * 1024
MEDIA_MAX_BYTES = 1_000_000  # the web process's file limit here: the upload routes take it and a form more
SLACK = 1024 * 1024  # what else the server may read meanwhile: its buffers (~100 KB), its database


def io_of(pid) -> dict[str, int]:
    rows = Path(f"/proc/{pid}/io").read_text().splitlines()
    return {name: int(value) for name, value in (row.split(": ") for row in rows)}


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if b"\r\n" in answer else None


def endless_post(web, path):
    """An attacker's POST: chunks without end (no Content-Length), sent as fast as the server
    takes them whatever it answers, until ENDLESS bytes or until the server closes the
    connection. The status of the server's answer (None: none came)."""
    address = urlsplit(web.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {address.hostname}\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode())
        piece, sent, answer = b"%x\r\n" % PIECE + b"a" * PIECE + b"\r\n", 0, b""
        try:
            while sent < ENDLESS:
                if select.select([sock], [], [], 0)[0]:  # an answer, or the server's end
                    if not (data := sock.recv(PIECE)):
                        return status_of(answer)
                    answer += data
                sock.sendall(piece)
                sent += PIECE
            sock.sendall(b"0\r\n\r\n")
            while b"\r\n" not in answer and (data := sock.recv(PIECE)):
                answer += data
        except (BrokenPipeError, ConnectionResetError):
            answer += salvaged(sock)
        return status_of(answer)


def salvaged(sock) -> bytes:
    """What the server sent before it reset the connection, if the kernel still has it."""
    try:
        return sock.recv(PIECE)
    except OSError:
        return b""


def webhook_urls(make_channel):
    """A Telegram webhook (the lean path), a WhatsApp one (Django's view), the admin's login
    and the playground's upload (the larger limit), each with the limit it must hold."""
    make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:x", "webhook_secret": "s3cret"})
    whatsapp_channel(make_channel)
    make_channel("playground", kind="webchat")
    general = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return {"/webhooks/telegram/tg/": general, "/webhooks/whatsapp/wa/": general, "/admin/login/": general,
            "/console/playground/playground/files": MEDIA_MAX_BYTES + general}


def test_an_endless_chunked_body_is_refused_at_its_limit_and_nothing_is_spooled(processes, make_channel):
    urls = webhook_urls(make_channel)
    web = processes.web(AGENTLOOP_MEDIA_MAX_BYTES=MEDIA_MAX_BYTES)
    seen = {}
    for path in urls:
        before = io_of(web.pid)
        status = endless_post(web, path)
        after = io_of(web.pid)
        seen[path] = {"status": status, "read": after["rchar"] - before["rchar"],
                      "written": after["wchar"] - before["wchar"]}
    # /mcp answers a request without its agent key before it reads the body: the connection
    # is closed with that answer, or the server would read the rest to keep it.
    before = io_of(web.pid)
    seen["/mcp"] = {"status": endless_post(web, "/mcp"), "read": io_of(web.pid)["rchar"] - before["rchar"]}
    for path, limit in urls.items():
        assert seen[path]["status"] == 413, seen
        assert seen[path]["read"] < limit + SLACK, seen  # what the server read of it: its limit, and no more
        assert seen[path]["written"] < 64 * 1024, seen  # nothing spooled to a file: its answer, a log line
    assert seen["/mcp"]["status"] == 401 and seen["/mcp"]["read"] < SLACK, seen
    assert local_http.get(f"{web.url}/healthz").status_code == 200


def test_a_declared_body_over_the_limit_is_refused_before_it_is_asked_for(processes, make_channel):
    urls = webhook_urls(make_channel)
    web = processes.web(AGENTLOOP_MEDIA_MAX_BYTES=MEDIA_MAX_BYTES)
    address = urlsplit(web.url)
    seen = {}
    for path, limit in urls.items():
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            # No byte of the body follows: a server that waited for it would never answer,
            # and one that asked for it would say 100 Continue first.
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {address.hostname}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {limit + 1}\r\nExpect: 100-continue\r\n\r\n".encode())
            try:
                status = status_of(sock.recv(PIECE))
            except TimeoutError:
                status = "no answer within 10 s"
        seen[path] = status
    assert seen == dict.fromkeys(urls, 413)


def test_a_file_over_the_general_limit_still_reaches_the_playground(processes, make_channel, tmp_path):
    """The upload routes' own limit is larger: a file of 600 KB (over the 256 KB any other
    body may have) is taken, through the real server, by a logged-in operator."""
    make_channel("playground", kind="webchat")
    get_user_model().objects.create_superuser("olga", "olga@example.com", "pw-olga-upload")
    web = processes.web(AGENTLOOP_MEDIA_MAX_BYTES=MEDIA_MAX_BYTES, AGENTLOOP_MEDIA_ROOT=tmp_path / "files")
    photo = b"\xff\xd8\xff" + b"x" * 600_000
    page = operator_session(web, "olga", "pw-olga-upload")
    sent = page.post("/console/playground/playground/files", headers={"X-CSRFToken": page.cookies["csrftoken"]},
                     data={"text": "la boleta", "id": "b1"}, files={"file": ("boleta.jpg", photo, "image/jpeg")})
    page.close()
    assert sent.status_code == 202, sent.text
    assert InboundMessage.objects.get().media_file.declared_size == len(photo)
