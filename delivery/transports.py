"""What a transport is to the ledger: one class per platform (in that platform's package,
conversations/platforms/<kind>/; `transport_for(channel)` below picks it — the one route
by which the ledger, typing, reactions and streaming reach a platform),
each with one send method returning a typed outcome: delivered, flood (retry after N s),
not sent (the request provably never left), temporary, permanent (the chat cannot be reached), ambiguous (the request went out and
no answer came back: it may have arrived), or channel blocked (the platform refused the
channel's credentials: its replies wait, attempts untouched). The ledger decides what to
do with each.

Transports are used from the worker's event loop only.
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx

from agentloop.core import plugins
from agentloop.core.caches import BoundedCache
from agentloop.core.redaction import channel_secrets, redact
from agentloop.core.tls import shared_tls_context
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.previews import Preview
from delivery.retry_after import clamp_retry_after

if TYPE_CHECKING:  # for annotations only
    from delivery.attachments import OutboundFile

Answered = TypeVar("Answered")


@dataclass(frozen=True)
class SendResult:
    outcome: str  # delivery.models.Outcome
    platform_message_id: str = ""
    error: str = ""
    retry_after: float = 0.0  # flood: seconds the platform asked us to wait
    # A permanent failure that says nothing of the chat (a template the platform refused):
    # the row is never retried, but the chat is not marked unreachable.
    chat_unreachable: bool = True

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.DELIVERED

    @classmethod
    def delivered(cls, platform_message_id: str | int | None = "") -> SendResult:
        return cls(Outcome.DELIVERED, platform_message_id=str(platform_message_id or ""))

    @classmethod
    def failed(cls, outcome: str, error: object, retry_after: float | None = None, secrets: Iterable[str] = (),
               chat_unreachable: bool = True) -> SendResult:
        """`secrets`: what the transport holds (its channel's), masked in the error text
        besides everything `redact` knows."""
        wait = clamp_retry_after(retry_after) if outcome == Outcome.FLOOD else 0.0
        return cls(outcome, error=redact(str(error), list(secrets))[:300], retry_after=wait,
                   chat_unreachable=chat_unreachable)


@dataclass(frozen=True)
class Target:
    """Where a message goes, as the platform addresses it."""

    chat_id: str
    reply_target: str = ""
    thread_id: str = ""
    conversation_id: int | None = None
    # Answer buttons under the message, as (label, opaque data) pairs: a question asking the
    # user to confirm an action (tools.confirmations). Platforms without buttons ignore them.
    buttons: tuple[tuple[str, str], ...] = ()
    # The same on every attempt at one ledger row's chunk ("" for sends outside the
    # ledger): a platform whose sends are idempotent by a client's id (Matrix's
    # transaction ids) sends it, so a resend after a crash is no second message.
    key: str = ""


class Capability(enum.StrEnum):
    """What a transport can do besides sending text (`Transport.capabilities`)."""

    FILES = "files"  # uploads (else the files are named under the text)
    TEMPLATES = "templates"  # approved templates outside a reply window
    TYPING = "typing"  # a "typing…" indicator
    REACTIONS = "reactions"  # status reactions on the person's message
    PREVIEWS = "previews"  # a reply shown while it is written (streaming)
    EDIT = "edit"  # a sent message's text replaced
    DELETE = "delete"  # a sent message removed


class Transport(abc.ABC):
    supports_typing = False
    # Seconds between two typing indicators: below the platform's own expiry, so the
    # indicator never blinks out while it is wanted. Also each call's deadline.
    typing_refresh = 4.0
    max_units: int | None = None  # the platform's limit on one message (UTF-16 units); None: no limit
    # Files: how many images one message may carry (an album), and a caption's length.
    max_album = 1
    caption_units = 1024

    def __init__(self, channel: Any) -> None:
        self.channel = channel  # conversations' Channel (this layer sits below it)

    def failed(self, outcome: str, error: object, retry_after: float | None = None,
               chat_unreachable: bool = True) -> SendResult:
        return SendResult.failed(outcome, error, retry_after, secrets=channel_secrets(self.channel),
                                 chat_unreachable=chat_unreachable)

    @abc.abstractmethod
    async def send_text(self, target: Target, text: str) -> SendResult:
        """Send `text`; the outcome says whether it landed and whether to try again."""

    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """Send one file chunk (delivery.attachments.OutboundFile, several only up to
        `max_album`), `caption` (the recovery marker, if any, already in front) under
        the first. A platform without uploads says what was attached instead."""
        names = "\n".join(f"📎 {item.name}" for item in files)
        return await self.send_text(target, f"{caption}\n{names}" if caption.strip() else names)

    async def send_template(self, target: Target, template: dict[str, Any]) -> SendResult:
        """Send an approved template ({"name", "language", "parameters"}: delivery.templates,
        the recovery marker, if any, already in its first parameter): what a platform with
        a reply window takes outside it. A platform without templates never gets one."""
        return self.failed(Outcome.PERMANENT, "this platform sends no templates", chat_unreachable=False)

    async def send_typing(self, target: Target) -> None:
        """Show "typing…"; only called when supports_typing."""

    def pace(self, chat_id: str) -> Pace | None:
        """The limits a send into `chat_id` falls under (delivery.pacing); None: unpaced."""
        return None

    # --- status reactions on the person's message (conversations/worker/reactions.py) ----
    # (seen, done): the emoji as this platform names them; None: it has no reactions.
    status_reactions: tuple[str, str] | None = None

    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """Our reaction on the person's message `message_id` becomes `emoji` ("": none),
        `previous` being the one we put there before ("": none). Raises on failure: the
        caller is best effort. Only asked of a transport whose `status_reactions` is set."""
        raise TypeError(f"{type(self).__name__} has no reactions (its status_reactions is None)")

    # --- streamed replies (delivery.previews, docs/streaming.md) ------------------------
    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        """How this chat shows a reply while it is written; None: it does not (the
        whole reply at once, typing meanwhile). `message_id`: a preview message an
        earlier run of the turn left in the chat (reused)."""
        return None

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """Replace a preview message's text with the final's (only for previews that
        are messages)."""
        return self.failed(Outcome.PERMANENT, "this platform has no message to edit")

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """Remove a stale preview message; delivered when it is gone (also when it was
        gone already)."""
        return self.failed(Outcome.PERMANENT, "this platform has no message to delete")

    @classmethod
    def capabilities(cls) -> frozenset[Capability]:
        """What this transport does besides text, detected from what it gives: the methods
        it overrides and the flags it sets — one place the worker, the docs and the tests
        can ask, so a platform never declares a capability it does not implement."""
        def gives(name: str) -> bool:
            return getattr(cls, name) is not getattr(Transport, name)

        found = {Capability.FILES: gives("send_files"), Capability.TEMPLATES: gives("send_template"),
                 Capability.TYPING: cls.supports_typing and gives("send_typing"),
                 Capability.REACTIONS: cls.status_reactions is not None and gives("set_reaction"),
                 Capability.PREVIEWS: gives("preview_for"), Capability.EDIT: gives("edit_text"),
                 Capability.DELETE: gives("delete_message")}
        return frozenset(capability for capability, given in found.items() if given)

    def paced(self, bot: str, chat_id: str, chat_interval: float) -> Pace | None:
        """A Pace from the channel's pace settings (conversations.platforms.base.pace_settings)."""
        pace = Pace.of(bot, float(self.channel.setting("messages_per_second") or 0), chat_id, chat_interval)
        return pace if pace.paced else None

    async def exchange(self, request_for: Callable[[dict[str, Any]], Coroutine[Any, Any, Answered]], host: str,
                       deadline: float) -> Answered | SendResult:
        """Await one HTTP exchange under one overall deadline — httpx's timeouts are per
        phase, and a peer trickling a byte a second would never trip them. `request_for`
        takes httpx's request extensions (a trace of the exchange's progress) and returns
        its coroutine. Returns the exchange's result, or the failed SendResult: not sent
        when its headers never went out (no pooled connection free, DNS, TCP, TLS,
        refused — whichever error or timer ended it), ambiguous when the request went out
        and no whole answer came back (it may have arrived)."""
        progress = Progress()
        try:
            return await asyncio.wait_for(request_for({"trace": progress.trace}), deadline)
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            if not progress.sent:
                return self.failed(Outcome.NOT_SENT, f"{type(exc).__name__} before the request went out to {host}")
            return self.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__}: {host} gave no answer within {deadline:g} s")


class LoopClients:
    """One httpx client per event loop (a client must not cross loops), shared by every
    channel of a platform in the process: its connections to the platform's API stay
    alive between replies (no TLS handshake per message); the token travels per request.
    Bounded: the worker has one loop, each safety sweep one of its own, closed at its end
    (`close`, from the platform's close_clients)."""

    def __init__(self) -> None:
        # The loop is kept beside its client: its id cannot be reused while it is cached.
        self._clients: BoundedCache[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = \
            BoundedCache(maxsize=16)

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        held = self._clients.get(id(loop))
        if held is None or held[0] is not loop:
            held = self._clients.set(id(loop), (loop, httpx.AsyncClient(verify=shared_tls_context())))
        return held[1]

    async def close(self) -> None:
        """Close the running loop's client (the worker's shutdown, a safety sweep's end)."""
        held = self._clients.pop(id(asyncio.get_running_loop()))
        if held is not None:
            await held[1].aclose()


class Progress:
    """Whether an httpx request's headers were written to its connection (httpcore's
    trace): until then nothing of it can have reached the server."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_headers.started"):
            self.sent = True


def outcome_for_http_status(status: int) -> str:
    """An HTTP answer to a send, for platforms that speak plain HTTP status codes: 2xx
    delivered, 429 flood, 408 and 5xx temporary, any other refusal permanent (resending
    the same request cannot help)."""
    if status < 300:
        return Outcome.DELIVERED
    if status == 429:
        return Outcome.FLOOD
    if status >= 500 or status == 408:
        return Outcome.TEMPORARY
    return Outcome.PERMANENT


# --- the platforms, as delivery sees them ---------------------------------------------------


class Carrier(Protocol):
    """What delivery needs of a platform. The platforms sit above delivery (in
    conversations/platforms/): settings.AGENTLOOP_PLATFORMS names one class per channel
    kind by dotted path, resolved by agentloop.core.plugins — one instance per kind,
    the same object conversations.platforms hands out (docs/architecture.md)."""

    def transport(self, channel: Any) -> Transport:
        """The Transport that sends this channel's replies."""
        ...

    async def close_clients(self) -> None:
        """Close the HTTP clients this platform's transports opened on the running loop."""
        ...


def carriers() -> dict[str, Carrier]:
    found: dict[str, Carrier] = plugins.instances("AGENTLOOP_PLATFORMS")
    return found


def transport_for(channel: Any) -> Transport:
    """The Transport that sends `channel`'s replies (its kind's platform picks it)."""
    try:
        carrier = carriers()[channel.kind]
    except KeyError:
        raise LookupError(f"no platform '{channel.kind}' (settings.AGENTLOOP_PLATFORMS)") from None
    return carrier.transport(channel)


async def close_clients() -> None:
    """Every platform's HTTP clients opened on the running event loop, closed (the
    worker's shutdown, the safety sweep's end)."""
    for carrier in carriers().values():
        await carrier.close_clients()
