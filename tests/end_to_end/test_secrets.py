"""Secrets never leave their field: sends that fail the ways networks fail (a connect
timeout, a peer that never answers) through the real ledger path and python-telegram-bot,
and agents that fail (a webhook agent's URL carrying its key, a provider echoing the API
key) under the real worker — then the whole database, the logs, the API and the
dashboard's payload are searched for every secret: zero occurrences."""

import asyncio
import json
import logging
import socket
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agentloop.console import dashboard
from agentloop.core.redaction import MASK, redact
from audit.events import record
from audit.models import EventKind
from conversations.models import AgentKey, Conversation, Turn, TurnState
from conversations.platforms.telegram.transport import close_bots
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
from tests.conftest import free_port, wait_until
from tests.fakes.openai_api import Error, FakeOpenAI
from tests.support import local_http
from tests.support.e2e import UNPACED

TOKEN_FULL = "7310042:AAF-fullBacklogToken_0123456789abcd"
TOKEN_SILENT = "7310043:AAG-silentPeerToken_9876543210wxyz"
WEBHOOK_SECRET = "whsec-Telegram-5d8e1c"
CALLBACK_SECRET = "cbsec-Replies-77aa21"
CALLBACK_KEY = "cbkey-inTheQuery-4410"
AGENT_KEY_IN_URL = "agkey-inTheHookUrl-9931"
AGENT_SECRET = "agsec-HmacKey-1207"
API_KEY = "sk-test-providerKey-0123456789abcdef"
API_KEY_ENV = "SECRETS_TEST_API_KEY"
SECRETS = [TOKEN_FULL, TOKEN_FULL.split(":")[1], TOKEN_SILENT, TOKEN_SILENT.split(":")[1], WEBHOOK_SECRET,
           CALLBACK_SECRET, CALLBACK_KEY, AGENT_KEY_IN_URL, AGENT_SECRET, API_KEY]


def dump_database() -> str:
    """Every row of every table, as text (SQLite and PostgreSQL alike)."""
    lines = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            lines += [f"{table}: {row!r}" for row in cursor.fetchall()]
    return "\n".join(lines)


def leaks(text, secrets=SECRETS) -> list:
    return [secret for secret in secrets if secret in text]


def secret_fields_only(text) -> str:
    """The dump without the channels' own rows: the one place the secrets belong."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("conversations_channel:"))


class FullBacklog:
    """A loopback listener whose accept queue is full (listen(0), filled with connections
    nobody accepts): a new connection's SYN is dropped, so connecting times out."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(0)
        self.port = self.server.getsockname()[1]
        self.fillers = []
        while not self._full():
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self.fillers.append(filler)
            assert len(self.fillers) < 64, "the accept queue never filled"

    def _full(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.3).close()
            return False
        except TimeoutError:
            return True

    def close(self):
        for sock in [*self.fillers, self.server]:
            sock.close()


class Silent:
    """Accepts every connection, reads what is sent, never answers."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self):
        for sock in [self.server, *self.held]:
            sock.close()


@pytest.fixture
def peers():
    full, silent = FullBacklog(), Silent()
    yield full, silent
    full.close()
    silent.close()


def conversation_on(channel, chat_id):
    from conversations.models import Contact

    contact = Contact.objects.create(channel=channel, platform_id=chat_id, display_name="Ana")
    return Conversation.objects.create(channel=channel, contact=contact, chat_id=chat_id, sender_id=chat_id)


def write_rows(conversation):
    """A fresh reply (its failure is recorded) and one on its last budgeted resend (its
    failure abandons it: an audit summary quoting the error)."""
    fresh = ledger.enqueue(conversation, "Su hora es el lunes.", kind=OutboundKind.REPLY)
    last = ledger.enqueue(conversation, "Y el martes.", kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=last.pk).update(state=OutboundState.FAILED, attempts=3,
                                                      next_attempt_at=timezone.now() - timedelta(seconds=1))
    return fresh, last


def send_all(rows):
    async def run():
        try:
            return list(zip(rows, await asyncio.gather(*(ledger.send(row) for row in rows))))
        finally:
            await close_bots()

    return asyncio.run(run())


@pytest.mark.django_db(transaction=True)
def test_failed_sends_leave_no_secret_in_the_database_logs_api_or_dashboard(make_channel, peers, caplog,
                                                                             monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    full, silent = peers
    timing_out = make_channel("tg-full", kind="telegram", platform_settings={
        "bot_token": TOKEN_FULL, "webhook_secret": WEBHOOK_SECRET, "api_base": f"http://127.0.0.1:{full.port}",
        **UNPACED})
    unanswered = make_channel("tg-silent", kind="telegram", platform_settings={
        "bot_token": TOKEN_SILENT, "api_base": f"http://127.0.0.1:{silent.port}", **UNPACED})
    make_channel("shop", platform_settings={
        "callback_url": f"https://shop.example/replies?key={CALLBACK_KEY}", "callback_secret": CALLBACK_SECRET},
        agent="webhook",
                 agent_config={"url": f"https://agent.local/hook?key={AGENT_KEY_IN_URL}", "secret": AGENT_SECRET})
    make_channel("llm", agent="openai", agent_config={"model": "m", "api_key_env": API_KEY_ENV})
    rows = [*write_rows(conversation_on(timing_out, "101")), *write_rows(conversation_on(unanswered, "102"))]

    caplog.set_level(logging.INFO)
    claimed = ledger.claim_due("w1")
    assert {row.pk for row in claimed} == {row.pk for row in rows}
    outcomes = send_all(claimed)
    with transaction.atomic():
        ledger.finish_many(outcomes, "w1")

    stored = {row.pk: OutboundMessage.objects.get(pk=row.pk) for row in rows}
    fresh_full, last_full, fresh_silent, last_silent = (stored[row.pk] for row in rows)
    # The failures are what they were: a connect timeout (never sent: deferred, nothing spent, so
    # the row on its last resend waits too), a peer that never answered (its last resend abandoned).
    assert (fresh_full.state, fresh_full.last_outcome) == (OutboundState.FAILED, Outcome.NOT_SENT)
    assert (last_full.state, last_full.last_outcome, last_full.attempts) == (OutboundState.FAILED, Outcome.NOT_SENT, 3)
    assert (fresh_silent.state, fresh_silent.last_outcome) == (OutboundState.FAILED, Outcome.AMBIGUOUS)
    assert last_silent.state == OutboundState.ABANDONED
    # Named by the error's type and the host, not the URL.
    assert f"went out to 127.0.0.1:{full.port}" in fresh_full.last_error, fresh_full.last_error
    assert f"127.0.0.1:{silent.port}" in fresh_silent.last_error, fresh_silent.last_error
    assert "/bot" not in fresh_full.last_error + fresh_silent.last_error

    database = secret_fields_only(dump_database())
    assert "resends spent; last error" in database  # the abandon's audit summary is in the dump
    assert leaks(database) == []
    assert "sends of channel tg-full failing" in caplog.text and leaks(caplog.text) == []

    key = AgentKey.objects.issue("monitor", [timing_out, unanswered])[1]
    from django.test import Client

    events = Client().get("/api/v1/audit/events", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert events.status_code == 200
    assert {e["kind"] for e in events.json()} >= {EventKind.REPLY_ABANDONED}
    assert leaks(events.content.decode()) == []
    picture = json.dumps(dashboard.snapshot(), default=str, ensure_ascii=False)
    assert "resends spent" in picture and leaks(picture) == []


@pytest.mark.django_db(transaction=True)
def test_an_old_unredacted_text_is_masked_on_the_way_out(make_channel):
    """A summary written before redaction existed (here: written around `record`)."""
    make_channel("tg-old", kind="telegram", platform_settings={"bot_token": TOKEN_FULL})
    event = record(EventKind.REPLY_ABANDONED, channel_slug="tg-old", summary="ok")
    from audit.models import AuditEvent

    AuditEvent.objects.filter(pk=event.pk).update(
        summary=f"Cannot connect to host https://api.telegram.org/bot{TOKEN_FULL}/sendMessage")
    picture = json.dumps(dashboard.snapshot(), default=str, ensure_ascii=False)
    assert f"/bot{MASK}/sendMessage" in picture and leaks(picture) == []


def test_redaction_knows_the_shapes_of_secrets_it_was_never_told():
    text = redact("GET https://u:hunter2hunter2@h.example/x?api_key=abc123def456&page=2 "
                  "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload "
                  "https://api.telegram.org/bot123:ABC/getMe 5550001:AAabcdefghijklmnopqrstuvwxyz")
    for secret in ("hunter2hunter2", "abc123def456", "eyJhbGciOiJIUzI1NiJ9", "123:ABC", "AAabcdefghijklmnopqrstuvwxyz"):
        assert secret not in text, text
    assert "page=2" in text and "h.example" in text


TG_SECRET = "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"  # the part after "<bot id>:"


@pytest.mark.parametrize("text, secrets", [
    # percent-encoded, as a URL inside a query string or a form body carries it
    ("GET /proxy?target=https%3A%2F%2Fapi.telegram.org%2Fbot123456%3A" + TG_SECRET + "%2FgetMe", [TG_SECRET]),
    ("token=123456%3A" + TG_SECRET, [TG_SECRET]),
    ("retry id 123456%253A" + TG_SECRET, [TG_SECRET]),  # encoded twice
    # after an underscore (a word character: no \b before the digits)
    ("cache_key=tg_123456:" + TG_SECRET, [TG_SECRET]),
    ("header x_sk-proj0123456789abcdef", ["proj0123456789abcdef"]),
    # a name like a secret's, outside any query string
    ("connect failed: user=bob password=hunter2hunter2 host=db", ["hunter2hunter2"]),
    ('config {"api_key": "abc123def456ghi", "region": "eu"}', ["abc123def456ghi"]),
    ("client_secret: s3cr3t-Value-99 (from the YAML)", ["s3cr3t-Value-99"]),
    # JSON's escaped slashes
    ('{"url": "https:\\/\\/bob:hunter2hunter2@db.example\\/x"}', ["hunter2hunter2"]),
    # split across lines (a wrapped log line, a terminal)
    ("bot 7310042:AAF-fullBacklogTok\nen_0123456789abcd failed", ["AAF-fullBacklogTok", "en_0123456789abcd"]),
])
def test_redaction_decodes_before_matching(text, secrets):
    shown = redact(text)
    assert MASK in shown and leaks(shown, secrets) == [], shown


def test_a_known_secret_is_found_escaped_or_split():
    secret = "Zq/9+xK2/wPartnerKey"  # base64-like: JSON escapes its slashes
    assert leaks(redact('{"v": "Zq\\/9+xK2\\/wPartnerKey"}', [secret]), ["wPartnerKey", "xK2"]) == []
    assert leaks(redact("the key Zq/9+xK2/wPart\r\nnerKey was refused", [secret]), ["Zq/9+xK2/wPart"]) == []


def test_ordinary_text_is_left_alone():
    for text in ("50% off, 100%3 is odd", "the key: turn left", "path C:\\Users\\ana", "línea uno\nlínea dos",
                 "tokens: 5 left", "see https://example.com/a%20b", "KeyError: 'start_datetime'",
                 "Tokenizer: whitespace_split"):
        assert redact(text) == text


# --- agents under the real worker ----------------------------------------------------------


def refusing_port():
    return free_port()  # bound then closed: connections are refused


def inbound(web, key, slug, message_id, text):
    response = local_http.post(f"{web.url}/api/v1/channels/{slug}/messages", timeout=10,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"message_id": message_id, "contact": "ana", "text": text})
    assert response.status_code == 202, response.text


@pytest.mark.e2e
def test_agent_failures_leave_no_secret_in_turn_outcomes_logs_api_or_dashboard(processes, make_channel):
    with FakeOpenAI() as fake_openai:
        # A provider that echoes the key it was given (the real API masks it; others do not).
        fake_openai.script(Error(401, message=f"Incorrect API key provided: {API_KEY}. Check your key."))
        hooked = make_channel("hooked", agent="webhook", agent_config={
            "url": f"http://127.0.0.1:{refusing_port()}/hook?key={AGENT_KEY_IN_URL}", "secret": AGENT_SECRET})
        modelled = make_channel("modelled", agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": API_KEY_ENV})
        key = AgentKey.objects.issue("monitor", [hooked, modelled])[1]
        web, worker = processes.web(wait=False), processes.worker(**{API_KEY_ENV: API_KEY})
        inbound(web, key, "hooked", "h1", "¿Hay hora el lunes?")
        inbound(web, key, "modelled", "m1", "¿Hay hora el martes?")
        wait_until(lambda: Turn.objects.filter(state=TurnState.FAILED).count() == 2, timeout=30,
                   message="both turns failed")
        assert fake_openai.requests  # the provider was asked, with the key
        outcomes = dict(Turn.objects.values_list("conversation__channel__slug", "outcome"))
        assert "127.0.0.1" in outcomes["hooked"] and "AuthenticationError" in outcomes["modelled"], outcomes

        database = secret_fields_only(dump_database())
        assert leaks(database) == [], outcomes
        log = worker.output()
        assert "ended without an answer" in log and leaks(log) == []
        events = local_http.get(f"{web.url}/api/v1/audit/events", headers={"Authorization": f"Bearer {key}"},
                           timeout=10)
        assert events.status_code == 200 and leaks(events.text) == []
        picture = json.dumps(dashboard.snapshot(), default=str, ensure_ascii=False)
        assert leaks(picture) == []
