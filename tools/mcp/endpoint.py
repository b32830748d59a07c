"""`/mcp` in the web process's ASGI app: the agent key checked (`Authorization: Bearer
<key>`, as the REST API), then the SDK's streamable HTTP session manager (stateless,
JSON answers: any web process can answer any request).

The web's bounds hold here by themselves (issue 51), whatever is in front of the mount:
a body over AGENTLOOP_MAX_BODY_BYTES is refused with 413 before more of it is read (a
declared length at once, a chunked one once past the limit: the SDK reads a whole body
into memory), and each key's requests count against the API's rate
(AGENTLOOP_API_RATE, DRF's throttle and its cache: /mcp and /api/v1 share one budget).

The session manager needs a task group that lives as long as the server; daphne has no
ASGI lifespan, so it is started by the first `/mcp` request, on the server's loop. The SDK
is imported then too, not when the web server starts: it costs every start about a third of
a second of CPU (tools/mcp/client.py), and most web servers never answer `/mcp`.
"""

from __future__ import annotations

import asyncio
import json
import re
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from rest_framework.throttling import UserRateThrottle  # type: ignore[import-untyped]  # DRF ships no types

from tools.conversation_side import conversation_side

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from agentloop.core.body_limit import App, Message, Receive, Scope, Send

# Why a request is refused: (status, error) or (status, error, seconds to wait).
Refusal = tuple[int, str] | tuple[int, str, float]

PATH = re.compile(r"^/mcp(?:/(?P<channel>[-a-zA-Z0-9_]{1,50}))?/?$")


def _key_for(raw: str, channel: str | None) -> tuple[Any, None] | tuple[None, Refusal]:  # key: an AgentKey
    """(the key, None) or (None, (status, error)) — on a thread."""
    close_old_connections()
    try:
        key = conversation_side().agent_key_for(raw)
        if key is None:
            return None, (401, "Unknown or revoked agent key.")
        if channel is not None and not key.channels.filter(slug=channel).exists():
            return None, (403, f"This key has no channel {channel}.")
        throttle = UserRateThrottle()  # the API's own, keyed by the agent key as the API's is
        if not throttle.allow_request(SimpleNamespace(user=key), None):
            return None, (429, "Too many requests for this key: the API's rate (AGENTLOOP_API_RATE) applies to "
                               "/mcp too.", throttle.wait())
        now = timezone.now()
        if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
            type(key).objects.filter(pk=key.pk).update(last_used_at=now)
        return key, None
    finally:
        close_old_connections()


class McpMount:
    """Routes `/mcp` and `/mcp/<channel>` to the MCP server, everything else to `app`."""

    def __init__(self, app: App) -> None:
        self.app = app
        # Once running: tools.mcp.server and its session manager.
        self._started: asyncio.Future[tuple[ModuleType, StreamableHTTPSessionManager]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if _declared_length(headers) > limit:
            return await _refuse(send, 413, f"The body is larger than {limit} bytes.")
        header = headers.get(b"authorization", b"").decode(errors="replace").split()
        if len(header) != 2 or header[0] != "Bearer":
            return await _refuse(send, 401, "Authorization header must be 'Bearer <agent key>'.")
        key, refusal = await sync_to_async(_key_for, thread_sensitive=False)(header[1], match["channel"])
        if refusal is not None:
            return await _refuse(send, *refusal)
        body = await _body_within(receive, limit)
        if body is None:
            return await _refuse(send, 413, f"The body is larger than {limit} bytes.")
        mcp_server, manager = await self._ensure_manager()
        scope = {**scope, mcp_server.KEY_IN_SCOPE: key, mcp_server.CHANNEL_IN_SCOPE: match["channel"]}
        await manager.handle_request(scope, _replay(body, receive), send)

    async def _ensure_manager(self) -> tuple[ModuleType, StreamableHTTPSessionManager]:
        """The MCP server module and its session manager, running."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            asyncio.ensure_future(self._serve(self._started))
        return await asyncio.shield(self._started)

    async def _serve(self, started: asyncio.Future[tuple[ModuleType, StreamableHTTPSessionManager]]) -> None:
        try:
            # The SDK's import cost is paid by the first /mcp request (module docstring), on a
            # thread: the loop goes on answering everything else while the SDK loads.
            server_module, manager_class = await asyncio.to_thread(_import_sdk)
            manager = manager_class(server_module.build(), stateless=True, json_response=True)
        except Exception as error:
            started.set_exception(error)
            self._started = None  # the next /mcp request tries again
            return
        async with manager.run():
            started.set_result((server_module, manager))
            await asyncio.Event().wait()  # as long as the server runs


def _import_sdk() -> tuple[ModuleType, type[StreamableHTTPSessionManager]]:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from tools.mcp import server as mcp_server

    return mcp_server, StreamableHTTPSessionManager


def _declared_length(headers: dict[bytes, bytes]) -> int:
    try:
        return int(headers.get(b"content-length", b"0"))
    except ValueError:
        return 0  # not a number: counted as it is read


async def _body_within(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None once it passes `limit` (no more of it is read)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client went away
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the SDK: the body read above, then what the client does next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(send: Send, status: int, error: str, retry_after: float | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is never read
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, round(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
