"""Where an MCP client may connect, how much of an answer it reads, and what it tells
about a failure (issue 51).

An MCP server's URL is set by operators in the admin: unchecked, saving one made the web
process connect wherever it named (an internal port, the cloud's metadata address) and
showed the error text. So a URL is judged as a media URL is (conversations.media.remote):

- `https`, a host, no user-info (`check_url`, when the row is saved);
- every address the host resolves to must be public (agentloop.core.addresses), checked
  on every request, and the request goes to the checked address (pinned: no second
  lookup a rebinding DNS server could answer differently), the name in SNI and `Host`;
- except the one URL the machine's holder allowed (`manage.py addmcpserver --internal`,
  kept in `internal_url`, which the admin cannot change): while the row's URL is still
  exactly that, it may be `http` and reach a private address.

An answer is read up to MAX_ANSWER_BYTES before anything parses it (a JSON body whole,
an event of an event stream, a line of a stdio server); a longer one fails the request
as a "bad answer". What went wrong is said as a category (CATEGORIES), never as the
server's or a library's text: that is logged at INFO, redacted, for the machine's holder.
"""

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import cast
from urllib.parse import urlsplit

import httpx2

from agentloop.core.addresses import address_problem

MAX_ANSWER_BYTES = 4 * 1024 * 1024
TOO_LONG = f"bad answer (longer than {MAX_ANSWER_BYTES} bytes)"
# What a failure to reach a server is called where operators read it.
CATEGORIES = ("refused", "timed out", "not allowed: <kind> address", "name not resolved", "TLS error",
              "bad answer", TOO_LONG, "command failed")


class Problem(Exception):
    """A failure we named ourselves: its category is its text."""


class NotAllowed(Problem):
    pass


class TooLong(Problem):
    def __init__(self) -> None:
        super().__init__(TOO_LONG)


def check_url(url: str, internal: bool) -> None:
    """ValueError saying what is wrong with an MCP server's URL, judged without a lookup."""
    parts = urlsplit(url)
    if parts.scheme != "https" and not (internal and parts.scheme == "http"):
        raise ValueError("an MCP server's URL must be https (http only for the URL the machine's holder allowed "
                         "with manage.py addmcpserver --internal)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not carry a user name or password: put credentials in the headers")
    if not parts.hostname:
        raise ValueError("the URL has no host")


def not_allowed(address: str) -> str:
    """The category refusing `address` ("" for a public one)."""
    why = address_problem(address)
    if not why:
        return ""
    kind = why.removeprefix("the address is ").split(":", 1)[0]
    return f"not allowed: {'non-public' if kind == 'not public' else kind} address"


async def pin(request: httpx2.Request, deadline: float) -> None:
    """Point `request` at a checked address of its host; NotAllowed if any is not public."""
    host, port = request.url.host, request.url.port or (443 if request.url.scheme == "https" else 80)
    try:
        found = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), deadline)
    except socket.gaierror:
        raise Problem("name not resolved") from None
    except TimeoutError:
        raise Problem("timed out") from None
    addresses = [str(info[4][0]) for info in found]
    for address in addresses:
        if why := not_allowed(address):
            raise NotAllowed(why)
    if not addresses:
        raise Problem("name not resolved")
    request.url = request.url.copy_with(host=addresses[0])
    if request.url.scheme == "https":
        request.extensions = {**request.extensions, "sni_hostname": host}  # the certificate checked for the name


def category(exc: BaseException) -> str:
    """What an exception from talking to a server is called (CATEGORIES)."""
    seen = list(_chain(exc))
    for found in seen:
        if isinstance(found, Problem):
            return str(found)
    for found in seen:
        if isinstance(found, ssl.SSLError):
            return "TLS error"
    for found in seen:
        if isinstance(found, (TimeoutError, httpx2.TimeoutException)):
            return "timed out"
        if isinstance(found, socket.gaierror):
            return "name not resolved"
        if isinstance(found, (ConnectionRefusedError, httpx2.ConnectError)):
            return "refused"
        if isinstance(found, (FileNotFoundError, PermissionError)):
            return "command failed"
    return "bad answer"


def _chain(exc: BaseException | None, depth: int = 0) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and those of a group's members."""
    while exc is not None and depth < 50:
        yield exc
        if isinstance(exc, BaseExceptionGroup):
            for member in exc.exceptions:
                yield from _chain(member, depth + 1)
        exc, depth = exc.__cause__ or exc.__context__, depth + 1


class CappedStream(httpx2.AsyncByteStream):
    """A response body read at most MAX_ANSWER_BYTES at a time: a JSON body in all, an
    event stream per event (the bytes since its last blank line)."""

    def __init__(self, stream: httpx2.AsyncByteStream, events: bool, on_too_long: Callable[[], object]) -> None:
        self.stream, self.events, self.on_too_long = stream, events, on_too_long

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = 0
        async for chunk in self.stream:
            if self.events:
                cut = max(chunk.rfind(b"\n\n"), chunk.rfind(b"\r\n\r\n"))
                held = len(chunk) - cut if cut >= 0 else held + len(chunk)
            else:
                held += len(chunk)
            if held > MAX_ANSWER_BYTES:
                self.on_too_long()
                raise TooLong()
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


def capped(response: httpx2.Response, on_too_long: Callable[[], object]) -> httpx2.Response:
    events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
    # An async transport's response (capped() is called by _GuardedTransport only): its stream is async.
    response.stream = CappedStream(cast(httpx2.AsyncByteStream, response.stream), events, on_too_long)
    return response
