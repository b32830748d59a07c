"""One limit on request bodies, held by the web server for every HTTP request, before any
of the application sees a byte of it (ASGI, outermost: Django, the lean webhook path,
/mcp and the static files behind it alike).

Why here and not in Django: Django's ASGI handler reads a whole body into a temporary
file (in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, on disk past it) before it routes or
authenticates the request; DATA_UPLOAD_MAX_MEMORY_SIZE is only checked afterwards, when
a view reads the body, and a chunked body declares no length for a view to check first.
One unauthenticated POST of endless chunks filled the disk.

- A declared `Content-Length` over the limit: 413 at once. The body is never asked for
  (a client waiting on `Expect: 100-continue` gets no 100 Continue).
- A chunked body is counted as the application reads it: once past the limit, the
  application is told the client went away (`http.disconnect`: Django aborts the
  request, the lean path drops it), gets no more of it, and whatever it still answers is
  dropped; the client gets the 413. No more of the body is read.

The 413 closes the connection (`Connection: close`): the rest of a body that is still
coming is never read, so the connection cannot carry another request.

The limit is AGENTLOOP_MAX_BODY_BYTES (DATA_UPLOAD_MAX_MEMORY_SIZE). A view marked with
`accepts_upload` (a file and its form: the API's message with its file, the playground's
attachment) takes AGENTLOOP_MAX_UPLOAD_BODY_BYTES instead. The route is looked up only
for a body that is past the general limit, so a webhook's POST never pays for it.
"""

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from django.conf import settings
from django.urls import Resolver404, resolve

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCONNECT: Message = {"type": "http.disconnect"}
View = TypeVar("View", bound=Callable[..., Any])


def general_limit() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def accepts_upload(view: View) -> View:
    """Marks a view whose requests carry a file: their bodies may reach
    AGENTLOOP_MAX_UPLOAD_BODY_BYTES, not only AGENTLOOP_MAX_BODY_BYTES."""
    view.accepts_upload = True  # type: ignore[attr-defined]
    return view


def route_limit(scope: Scope) -> int:
    """The largest body the request's route takes (its view's, as Django would resolve it)."""
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    try:
        view = resolve(path, urlconf=settings.ROOT_URLCONF).func
    except Resolver404:
        return general_limit()
    if getattr(view, "accepts_upload", False):
        return int(settings.AGENTLOOP_MAX_UPLOAD_BODY_BYTES)
    return general_limit()


def declared_length(scope: Scope) -> int | None:
    """The body's length as the request frames it: its Content-Length, 0 without one and
    without Transfer-Encoding (no body); None when only the arriving bytes can tell
    (chunked: Transfer-Encoding wins over a Content-Length beside it)."""
    length: int | None = 0
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
    return length


class _Limit:
    """The limit that holds for one request: the general one, widened to its route's the
    first time a body would pass it."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.bytes = general_limit()
        self.looked_up = False

    def allows(self, size: int) -> bool:
        if size > self.bytes and not self.looked_up:
            self.looked_up = True
            self.bytes = route_limit(self.scope)
        return size <= self.bytes


class _CountedBody:
    """The application's receive and send for one request whose body is counted."""

    def __init__(self, limit: _Limit, receive: Receive, send: Send):
        self.limit, self._receive, self._send = limit, receive, send
        self.seen = 0
        self.over = False
        self.whole = False  # the body's last chunk has come
        self.answering = False  # the application's answer has gone out (its start)

    async def receive(self) -> Message:
        if self.over:
            return DISCONNECT
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            self.whole = not message.get("more_body", False)
            if not self.limit.allows(self.seen):
                self.over = True
                return DISCONNECT
        return message

    async def send(self, message: Message) -> None:
        if self.over and not self.answering:
            return  # its answer to a body it never got whole: the client gets the 413
        if message["type"] == "http.response.start":
            self.answering = True
            if not self.whole:
                # An answer before the body's end: the server would read (and drop) the
                # rest to keep the connection, however long it is. It closes it instead.
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await self._send(message)


async def too_large(send: Send, limit: int) -> None:
    body = json.dumps({"ok": False, "error": "request body too large", "limit_bytes": limit}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: every HTTP request's body held to its limit (module docstring)."""

    def __init__(self, app: App):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = _Limit(scope)
        declared = declared_length(scope)
        if declared is not None:
            if not limit.allows(declared):
                return await too_large(send, limit.bytes)
            # The server's parser reads a framed body to its declared length and no further
            # (what follows is the next request): nothing to count.
            return await self.app(scope, receive, send)
        body = _CountedBody(limit, receive, send)
        await self.app(scope, body.receive, body.send)
        if body.over and not body.answering:
            await too_large(send, limit.bytes)
