"""What every webhook platform does with a request, in one place: find the channel →
authenticate → parse into our own types → admit.

A platform subclasses `Webhook` and gives the two steps that are its own:
`authenticate(channel, request)` (its secret or signature, compared in constant time:
the helpers below) and `parse(channel, request)` (the body into Inbound messages, Edits,
Reactions, Deletions or its own items, or an immediate Answer), then `answer(received,
results)`, the body its platform expects back. Finding the channel (the active channel of
the platform's kind by slug), the size limit, the refusal of what the database cannot
store (recorded before anything is admitted, the same way for every platform) and the
admission itself are this class's, the same for all.

Two drivers, one object: `view(webhook)`, the Django view the platform's `urls()` mount
under /webhooks/<kind>/, and conversations/lean_ingest.py, which admits the POSTs of a
webhook whose `lean` is set in batches without Django's request stack (`prepare`, then
`alone()` to the batch or `admit`; `answer` either way), so both answer alike.

A platform that keeps a connection open instead subclasses `Connection`: its items go
through the same refusal and admission (`Intake`, which both are); the worker runs it
(conversations.platforms.connection).
"""

from __future__ import annotations

import abc
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.exceptions import RequestDataTooBig
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from conversations import deletions, edits, reactions
from conversations.ingest import Inbound, admit, record_refusal, refusal
from conversations.models import Channel
from conversations.platforms.webhooks import Answer, error

if TYPE_CHECKING:  # for annotations only
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern

    from conversations.platforms.base import Platform


@dataclass(frozen=True)
class Request:
    """A webhook request as a platform reads it, the same from either driver."""

    method: str
    headers: Mapping[str, str]  # by lower-case name
    body: bytes | None  # None: over the size limit (answered 413 once authenticated)
    query: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Parsed:
    """What a request carried, in the order it is admitted: Inbound, edits.Edit,
    reactions.Reaction, deletions.Deletion, or an item of the platform's own (its
    `apply` takes it: WhatsApp's delivery receipts). `ignored`: how many things in it
    nothing is done with (the platform's answer may count them)."""

    items: list[object]
    ignored: int = 0


@dataclass(frozen=True)
class Refused:
    """The result of an item the database cannot store: refused alone, audited."""

    problem: str


@dataclass(frozen=True)
class Received:
    """A request authenticated and parsed, its unstorable items refused (already
    recorded): what `admit` admits. `refused`: by the item's index."""

    channel: Channel
    parsed: Parsed
    refused: dict[int, str]

    def alone(self) -> Inbound | None:
        """The message, when one storable message is all the request holds (the lean
        path admits it in a batch with others'); else None."""
        items = self.parsed.items
        if len(items) == 1 and not self.refused and isinstance(items[0], Inbound):
            return items[0]
        return None


class Intake:
    """What every way in shares, a webhook's or a connection's (conversations.platforms.
    connection): the refusal of unstorable input, the same for every platform, then each
    item admitted or applied — the dedup is the admission's."""

    refusal_source = "webhook"  # how an unstorable message's refusal is audited

    def __init__(self, platform: Platform) -> None:
        self.kind, self.label = platform.kind, platform.label

    def apply(self, channel: Channel, item: object) -> object:
        """One item admitted or applied, each in its own transaction."""
        if isinstance(item, Inbound):
            return admit(channel, item)
        if isinstance(item, edits.Edit):
            return edits.apply(channel, item)
        if isinstance(item, reactions.Reaction):
            return reactions.apply(channel, item)
        if isinstance(item, deletions.Deletion):
            return deletions.apply(channel, item)
        raise TypeError(f"{type(self).__name__} cannot apply a {type(item).__name__}")

    def receive(self, channel: Channel, parsed: Parsed) -> Received:
        """The items no retry could store, refused and audited before anything is
        admitted (the platform is answered 2xx for them, so it stops resending)."""
        refused = {}
        for index, item in enumerate(parsed.items):
            problem = refusal(item) if isinstance(item, Inbound) else \
                edits.refusal(item) if isinstance(item, edits.Edit) else ""
            if problem:
                record_refusal(channel, item, problem, self.refusal_source)  # type: ignore[arg-type]  # an Edit has the ids it reads
                refused[index] = problem
        return Received(channel, parsed, refused)

    def results(self, received: Received) -> list[object]:
        """Each item applied in order (an unstorable one skipped): what became of each."""
        return [Refused(received.refused[index]) if index in received.refused else self.apply(received.channel, item)
                for index, item in enumerate(received.parsed.items)]


class Webhook(Intake, abc.ABC):
    """One webhook URL of a platform. Subclasses give `authenticate`, `parse`, `answer`."""

    route = "<slug:slug>/"  # under /webhooks/<kind>/
    url_name = "webhook"
    methods: tuple[str, ...] = ("POST",)  # others: 405 (a GET is given to `handshake`)
    lean = False  # its POSTs may take the lean ASGI path (conversations/lean_ingest.py)

    # --- the steps ------------------------------------------------------------------
    def find_channel(self, slug: str) -> Channel | None:
        return Channel.objects.active(slug, self.kind)

    @abc.abstractmethod
    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        """None when the request is the platform's (checked in constant time); else the
        refusal (401 or 403; 413 when the check needs the body and it was too large)."""

    @abc.abstractmethod
    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        """The body (never None here) into our own types, or the Answer to give at once:
        a malformed body (400), nothing to act on, a verification challenge, a tap on a
        button (handled here: it is no message)."""

    @abc.abstractmethod
    def answer(self, received: Received, results: list[object]) -> Answer:
        """The platform's answer once every item is through: `results` by item, each a
        Refused, an ingest.Admission, an EditResult, a ReactionResult, a DeletionResult
        or what the platform's `apply` returned for its own item."""

    def handshake(self, channel: Channel, request: Request) -> Answer:
        """A request other than a POST (among `methods`): a verification handshake."""
        return error(405, "method not allowed")

    def takes_lean(self, body: bytes | None) -> bool:
        """Whether the lean path may answer this POST; False sends it to the Django view
        (a request that calls out to the platform, off the lean path's admitter threads)."""
        return True

    # --- the drivers' ---------------------------------------------------------------
    def prepare(self, slug: str, request: Request) -> Answer | Received:
        """Every step before the admission: the Answer to give at once, or what to admit."""
        channel = self.find_channel(slug)
        if channel is None:
            return error(404, f"no active {self.label} channel '{slug}'")
        if request.method != "POST":
            return self.handshake(channel, request)
        refused = self.authenticate(channel, request)
        if refused is not None:
            return refused
        if request.body is None:
            return error(413, "request body too large")
        parsed = self.parse(channel, request)
        if isinstance(parsed, Answer):
            return parsed
        return self.receive(channel, parsed)

    def admit(self, received: Received) -> Answer:
        """Each item applied in order (an unstorable one skipped), then the answer."""
        return self.answer(received, self.results(received))

    def respond(self, slug: str, request: Request) -> Answer:
        prepared = self.prepare(slug, request)
        # Anything failing in the admission is ours: a 500 makes the platform retry, and
        # the dedup makes the retry safe.
        return prepared if isinstance(prepared, Answer) else self.admit(prepared)

    def urls(self) -> list[URLPattern]:
        return [path(self.route, view(self), name=self.url_name)]


# receive(payloads, cursor) → how many were new; returns once they are admitted and the cursor stored.
Receive = Callable[[Sequence[Any], "int | None"], Awaitable[int]]


class Connection(Intake, abc.ABC):
    """A platform that keeps a connection open per channel (Discord's Gateway, Slack
    Socket Mode, Matrix sync): the worker runs `session` for each of `channel_ids()`, one
    per channel across all workers, again after every drop (conversations.platforms.
    connection). Subclasses give `session` and `parse`."""

    refusal_source = "connection"

    def channel_ids(self) -> list[int]:
        """The channels to keep connected: the active ones of this kind."""
        return list(Channel.objects.filter(kind=self.kind, is_active=True).values_list("pk", flat=True))

    @abc.abstractmethod
    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        """Connect (resuming after `cursor`, the last one stored; None: never connected
        before), and for what arrives `await receive(payloads, cursor)`: it returns once
        they are admitted and `cursor` is stored, and only then may the platform be told
        they were received. Return or raise when the connection drops: it is opened again."""

    @abc.abstractmethod
    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        """One payload the connection received into our own types; None: nothing to act on."""


def view(webhook: Webhook) -> Callable[..., HttpResponse]:
    """The Django view of a webhook (mounted at /webhooks/<kind>/<route>)."""

    @csrf_exempt
    @require_http_methods(list(webhook.methods))
    def receive(request: HttpRequest, slug: str) -> HttpResponse:
        return webhook.respond(slug, request_of(request)).response()

    return receive


def request_of(request: HttpRequest) -> Request:
    try:
        body: bytes | None = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    return Request(request.method or "", {name.lower(): value for name, value in request.headers.items()}, body,
                   {name: str(value) for name, value in request.GET.items()})


# --- authentication helpers ---------------------------------------------------------------
def same(expected: str, supplied: str) -> bool:
    """Two secrets compared in constant time (no timing tells how much of one matched)."""
    return hmac.compare_digest(expected.encode(), supplied.encode())


def hmac_sha256(secret: str, message: bytes) -> str:
    """The hex HMAC-SHA256 of `message` keyed by `secret` (what a signature header holds)."""
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def unconfigured(secret: str, option: str) -> Answer:
    """The channel has no `secret` to check requests with: every request is refused."""
    return error(403, f"this channel has no {secret} configured; set one (addchannel {option})")


def missing(*headers: str) -> Answer:
    return error(401, f"missing {' or '.join(headers)} header")


def wrong(header: str) -> Answer:
    return error(403, f"wrong {header}")


def shared_secret(request: Request, header: str, secret: str, option: str, name: str) -> Answer | None:
    """A secret the platform sends back as is in `header` (Telegram's): None when it is
    the channel's `secret`; `name` and `option` say which setting is missing."""
    if not secret:
        return unconfigured(name, option)
    supplied = request.header(header)
    if supplied is None:
        return missing(header)
    return None if same(secret, supplied) else wrong(header)


def signed(request: Request, header: str, secret: str, option: str, name: str,
           expected: Callable[[bytes], str]) -> Answer | None:
    """A signature of the body in `header` (WhatsApp's X-Hub-Signature-256): None when it
    is `expected(body)`, compared in constant time; 413 before, when the body was too large."""
    if not secret:
        return unconfigured(name, option)
    supplied = request.header(header)
    if supplied is None:
        return missing(header)
    if request.body is None:
        return error(413, "request body too large")
    return None if same(expected(request.body), supplied.strip()) else wrong(header)
