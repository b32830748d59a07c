"""The lean path of the webhooks: an ASGI app in front of Django's.

Measured (profile in issue 12): of a webhook POST's time under daphne, Django's full
request stack — a fresh thread per request, the middleware chain, the URL resolver —
cost more than the admission itself. This path serves the POSTs to
/webhooks/<kind>/<slug>/ of every platform whose webhook is `lean`
(conversations.platforms.inbound.Webhook: Telegram's, Slack's Events API) without it;
every other request goes on to Django.

The answers are the view's own — the same object drives both (Webhook.prepare: the
channel, the authentication, the parse, the refusal of unstorable input; Webhook.answer)
—, the 503 + Retry-After of a database outage is the middleware's, and the guarantees do
not move:

- Group commit. One thread with its own connection (the admitter) takes the requests
  that arrived while it was busy as one batch: one transaction, no savepoint per
  admission (ingest.admit_many: a batch that fails is admitted again one by one), one
  commit. A request is answered only after the commit that holds its message; one bad
  admission fails alone.
- The dedup is the database's (the admission's INSERT … ON CONFLICT DO NOTHING).
- A request that is not one new message (an edit, a reaction, a deletion: rare) takes a
  slower path of its own: Webhook.admit, each in its own transaction after the batch's
  admissions commit, so a message and its edit in one batch apply in that order and a
  normal message never waits for an edit.
- A request this path does not fully handle (a proxy or HTTPS redirect set-up, a host
  not allowed, one the webhook does not take: Webhook.takes_lean) is left to Django,
  which answers it as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl

from django.conf import settings
from django.db import connection
from django.http.request import split_domain_port, validate_host

from agentloop.core import metrics
from agentloop.core.db_connection import close_broken_connection, opened_before_a_fault
from agentloop.core.middleware import RETRY_AFTER_SECONDS, _describe, _log_fault, database_unavailable
from conversations import ingest, platforms
from conversations.platforms.inbound import Request
from conversations.platforms.webhooks import Answer

if TYPE_CHECKING:  # for annotations only
    from conversations.ingest import Inbound
    from conversations.models import Channel
    from conversations.platforms.inbound import Received, Webhook

log = logging.getLogger(__name__)

# ASGI's shapes: a scope and its messages are dicts of whatever the server puts in them.
Scope = dict[str, Any]
Message = dict[str, Any]
ASGIReceive = Callable[[], Awaitable[Message]]
ASGISend = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, ASGIReceive, ASGISend], Awaitable[None]]
# One request on its way to an admitter: (webhook, slug, request); with its waiter's loop and
# future, and when it was queued (time.monotonic()).
Job = tuple["Webhook", str, Request]
Queued = tuple["Webhook", str, Request, asyncio.AbstractEventLoop, "asyncio.Future[Answer]", float]
# A request that is one new message: (its index in the batch, what was prepared, the message).
Admissible = tuple[int, "Received", "Inbound"]

# /webhooks/<kind>/<slug>/: the slug as Django's <slug:slug> converter reads it.
PLATFORM_PATH = re.compile(r"/webhooks/([a-z0-9_]+)/([-a-zA-Z0-9_]+)/")
MAX_BATCH = 64
# Two: one batch is built while the other waits for the server. With four, batches were
# smaller, and a batch's statements are one per table whatever its size (ingest.admit_many):
# tests.bench.cpu on PostgreSQL, 2 cores, 385-435 POSTs/s with four, 452-488 with two.
POSTGRES_ADMITTERS = 2
# An idle connection may have died (a database restart); it is checked before use.
IDLE_CHECK_SECONDS = 1.0
# A request that waited longer than this for an admitter is answered 503 without being
# admitted: its sender has given up by now (Slack waits 3 s) and sends it again. While the
# database is away (a failover: a connect alone may take DATABASE_CONNECT_TIMEOUT), the
# queue fills with copies nobody waits for any more; admitting them once the database is
# back would only keep the new requests waiting behind them.
QUEUE_DEADLINE = 3.0

UNAVAILABLE = Answer(503, {"ok": False, "error": "database unavailable, retry later"})
SERVER_ERROR = Answer(500, {"ok": False, "error": "internal server error"})


class Admitter:
    """The threads that prepare and admit the lean path's requests, in batches: one on
    SQLite (its writers take turns anyway), a few on PostgreSQL, where a batch mostly
    waits for the server's answers."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[Queued | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.started = threading.Lock()

    async def answer(self, webhook: Webhook, slug: str, request: Request) -> Answer:
        """`webhook`: the platform's (conversations.platforms.inbound.Webhook)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        if not self.threads:
            self._start()
        self.requests.put((webhook, slug, request, loop, future, time.monotonic()))
        return await future

    def _start(self) -> None:
        with self.started:
            if not self.threads:
                count = 1 if connection.vendor == "sqlite" else POSTGRES_ADMITTERS
                self.threads = [threading.Thread(target=self._run, name=f"lean-admitter-{i}", daemon=True)
                                for i in range(count)]
                for thread in self.threads:
                    thread.start()

    def stop(self) -> None:
        """End the threads (after the requests already queued) and close their connections."""
        with self.started:
            threads, self.threads = self.threads, []
        for _ in threads:
            self.requests.put(None)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        last_used = 0.0
        try:
            while (batch := self._next_batch()) is not None:
                if opened_before_a_fault() or time.monotonic() - last_used > IDLE_CHECK_SECONDS:
                    close_broken_connection()
                answers = self._answer_batch(batch)
                last_used = time.monotonic()
                by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Answer], Answer]]] = {}
                for (_, _, _, loop, future, _), answer in zip(batch, answers):
                    by_loop.setdefault(loop, []).append((future, answer))
                for loop, pairs in by_loop.items():
                    try:
                        loop.call_soon_threadsafe(_resolve, pairs)
                    except RuntimeError:  # that loop is closed (shutting down): nobody waits
                        pass
        finally:
            connection.close()

    def _next_batch(self) -> list[Queued] | None:
        """The requests waiting now (at least one; at most MAX_BATCH), or None to stop."""
        batch: list[Queued] = []
        item = self.requests.get()
        while item is not None:
            batch.append(item)
            if len(batch) == MAX_BATCH:
                return batch
            try:
                item = self.requests.get_nowait()
            except queue.Empty:
                return batch
        # stop(): answer what came before it first
        if batch:
            self.requests.put(None)
            return batch
        return None

    def _answer_batch(self, batch: list[Queued]) -> list[Answer]:
        now = time.monotonic()
        answers = [UNAVAILABLE] * len(batch)
        fresh = [i for i, queued in enumerate(batch) if now - queued[5] <= QUEUE_DEADLINE]
        if len(fresh) < len(batch):
            _log_fault("QueueDeadline", f"requests queued longer than {QUEUE_DEADLINE:g} s answered 503")
        if not fresh:
            return answers
        try:
            admitted = self._prepare_and_admit([batch[i][:3] for i in fresh])
        except Exception as exc:  # the batch as a whole: the database is away, or a bug
            admitted = [_failure(exc)] * len(fresh)
        for i, answer in zip(fresh, admitted):
            answers[i] = answer
        return answers

    def _prepare_and_admit(self, batch: list[Job]) -> list[Answer]:
        answers: list[Answer] = [SERVER_ERROR] * len(batch)  # each replaced below
        admissions: list[Admissible] = []
        aside: list[tuple[int, Received]] = []
        for i, (webhook, slug, request) in enumerate(batch):
            try:
                prepared: Answer | Received = webhook.prepare(slug, request)
            except Exception as exc:
                if database_unavailable(exc):
                    raise
                prepared = _failure(exc)
            if isinstance(prepared, Answer):
                answers[i] = prepared
            elif (message := prepared.alone()) is not None:
                admissions.append((i, prepared, message))
            else:  # an edit, a reaction, a deletion, a refusal
                aside.append((i, prepared))
        if admissions:
            self._admit(admissions, answers, [batch[i][0] for i, *_ in admissions])
        # Edits are rare: each its own transaction, after the batch's messages (an edit
        # may follow its message in the same batch), never in the messages' way.
        for i, received in aside:
            try:
                answers[i] = batch[i][0].admit(received)
            except Exception as exc:
                answers[i] = _failure(exc)
        return answers

    def _admit(self, admissions: list[Admissible], answers: list[Answer], webhooks: list[Webhook]) -> None:
        # Conversations locked in one order by every batch, so concurrent batches never
        # wait for each other in a cycle (a stable sort: a conversation's own messages
        # keep their order). `webhooks`: each admission's platform webhook, in their order.
        order = sorted(range(len(admissions)), key=lambda n: _conversation_key(admissions[n][1].channel,
                                                                                 admissions[n][2]))
        admissions, webhooks = [admissions[n] for n in order], [webhooks[n] for n in order]
        results = ingest.admit_many([(received.channel, message) for _, received, message in admissions],
                                    database_unavailable)
        for (i, received, _), webhook, result in zip(admissions, webhooks, results):
            answers[i] = _failure(result) if isinstance(result, Exception) else webhook.answer(received, [result])


def _conversation_key(channel: Channel, inbound: Inbound) -> tuple[int, str, str]:
    return channel.pk, inbound.chat_id, inbound.sender_id


def _failure(exc: BaseException) -> Answer:
    """The answer to a request that failed: 503 while the database is away (logged once
    per fault kind per interval, the broken connection closed), else 500."""
    if database_unavailable(exc):
        _log_fault(type(exc.__cause__ or exc).__name__, _describe(exc))
        close_broken_connection()
        metrics.DATABASE_UNAVAILABLE_ANSWERS.inc()
        return UNAVAILABLE
    log.error("webhook admission failed", exc_info=exc)
    return SERVER_ERROR


def _resolve(pairs: list[tuple[asyncio.Future[Answer], Answer]]) -> None:
    for future, answer in pairs:
        if not future.done():
            future.set_result(answer)


class LeanIngest:
    """ASGI: the POSTs of the lean webhooks, everything else to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.admitter = Admitter()

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = PLATFORM_PATH.fullmatch(scope["path"])
            webhook = _lean_webhook(match[1]) if match else None
            if match and webhook is not None and self._takes(scope):
                return await self._webhook((webhook, match[2]), scope, receive, send)
        return await self.app(scope, receive, send)

    def _takes(self, scope: Scope) -> bool:
        """Only requests Django would serve as they are: no HTTPS redirect or proxy
        headers to honour, no script prefix, an allowed Host."""
        if settings.SECURE_SSL_REDIRECT or settings.USE_X_FORWARDED_HOST or scope.get("root_path"):
            return False
        host = _header(scope, b"host")
        if host is None:
            return False
        domain, _ = split_domain_port(host.decode("latin-1"))
        allowed = settings.ALLOWED_HOSTS or ([".localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else [])
        return bool(domain) and validate_host(domain, allowed)

    async def _webhook(self, route: tuple[Webhook, str], scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        """`route`: (the platform's webhook, the channel's slug)."""
        webhook, slug = route
        body = await _read_body(receive, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        if body is False:
            return  # the client went away
        if not webhook.takes_lean(body):
            return await self.app(scope, _replay(body), send)
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        await _respond(send, await self.admitter.answer(webhook, slug, Request("POST", headers, body, query)))


def _lean_webhook(kind: str) -> Webhook | None:
    """The platform's webhook when it is lean, or None (no such platform, or Django serves it)."""
    try:
        webhook = platforms.get(kind).webhook()
    except platforms.UnknownPlatform:
        return None
    return webhook if webhook is not None and webhook.lean else None


def _replay(body: bytes | None) -> ASGIReceive:
    """An ASGI `receive` that hands over a body already read, then waits like a client
    that stays connected (Django cancels its wait once the answer is sent)."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}  # never reached: the wait is cancelled

    return receive


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            found: bytes = value
            return found
    return None


async def _read_body(receive: ASGIReceive, limit: int | None) -> bytes | None | Literal[False]:
    """The request body; None when it is over `limit` bytes (read to its end, not kept);
    False when the client disconnected."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is None or size <= limit:
            chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks) if limit is None or size <= limit else None


def _security_headers() -> list[tuple[bytes, bytes]]:
    """The headers Django's middleware adds to such an answer (plain HTTP)."""
    headers = [(b"x-frame-options", settings.X_FRAME_OPTIONS.encode())]
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        headers.append((b"referrer-policy", settings.SECURE_REFERRER_POLICY.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    return headers


async def _respond(send: ASGISend, answer: Answer) -> None:
    if isinstance(answer.body, str):
        body, content_type = answer.body.encode(), b"text/plain"
    else:
        body, content_type = json.dumps(answer.body).encode(), b"application/json"
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *_security_headers()]
    if answer.status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
