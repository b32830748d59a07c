"""python-telegram-bot's HTTP layer on aiohttp (PTB's documented extension point,
`telegram.request.BaseRequest`).

Measured here against a local Bot API server: 600 sendMessage calls took 1.7 s of the
event loop's time through httpx and 0.4 s through aiohttp. With hundreds of turns
replying at once the client's own CPU was the limit, so replies and typing indicators
go through this class; PTB still builds every request and maps every error.
"""

import json
from urllib.parse import urlsplit

import aiohttp
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

from delivery.retry_after import clamp_retry_after


class NotSent(NetworkError):
    """The connection could not be made: the request never reached the server."""


class SentUnanswered(NetworkError):
    """The connection broke after the request went out: it may have been delivered."""

    ambiguous = True


class AiohttpRequest(BaseRequest):
    def __init__(self, connections=8, read_timeout=5.0, write_timeout=5.0, connect_timeout=5.0):
        self._connections = connections
        self._timeouts = {"read": read_timeout, "write": write_timeout, "connect": connect_timeout}
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._timeouts["read"]

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._connections))

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def _timeout(self, read_timeout, write_timeout, connect_timeout):
        def pick(value, name):
            return self._timeouts[name] if value is BaseRequest.DEFAULT_NONE else value

        read, write = pick(read_timeout, "read"), pick(write_timeout, "write")
        # aiohttp has no write timeout of its own: bound the whole exchange by both.
        total = None if read is None or write is None else read + write
        return aiohttp.ClientTimeout(total=total, sock_connect=pick(connect_timeout, "connect"), sock_read=read)

    @staticmethod
    def _body(request_data: RequestData | None):
        if request_data is None:
            return None
        files = request_data.multipart_data
        if not files:
            return request_data.json_parameters  # form-encoded, as PTB's own HTTPX layer sends
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
        timeout = self._timeout(read_timeout, write_timeout, connect_timeout)
        try:
            async with self._session.request(method, url, data=self._body(request_data), timeout=timeout,
                                             headers={"User-Agent": self.USER_AGENT}) as response:
                payload = await response.read()
                return response.status, sane_flood_answer(payload) if response.status == 429 else payload
        # Errors name the error's type and the host, never the URL: it carries the bot's
        # token (…/bot<TOKEN>/sendMessage), and aiohttp puts it in its messages.
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise NotSent(f"aiohttp.{type(exc).__name__} connecting to {_host(url)}") from exc
        except TimeoutError as exc:
            # As PTB's own layer: a timeout after the request went out may have been delivered.
            raise TimedOut(f"Timed out waiting for {_host(url)}") from exc
        except aiohttp.ClientError as exc:
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
