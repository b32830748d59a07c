"""The SDK side of tools/mcp/client.py: one connection per registered server per process,
kept open on an event loop of its own (a daemon thread). Imported on first use only
(client.LazyHub); the rest of the product imports client.py."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from agentloop.core.redaction import redact
from tools.mcp import reach
from tools.mcp.outcomes import CONNECT_SECONDS, AnswerLost, ServerError, ServerSpec, Unreachable
from tools.mcp.stdio import bounded_stdio

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams
    from mcp.client.session import IncomingMessage, MessageHandlerFnT

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass
class _Attempt:
    """One opening, listing or call: whether its connection was refused (nothing sent),
    and what went wrong, as a category (reach.CATEGORIES)."""

    refused: bool = False
    problem: str = ""


_attempt: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar("mcp_attempt", default=None)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    """Each request to a checked address (reach.pin) unless the URL is the internal one
    the machine's holder allowed; each answer read capped (reach.capped). Records on the
    current attempt (a context variable the SDK's POST tasks inherit) what went wrong,
    and that a connection was refused."""

    def __init__(self, spec: ServerSpec) -> None:
        super().__init__(trust_env=False)
        self.spec = spec

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        attempt = _attempt.get()
        try:
            if not self.spec.internal:
                await reach.pin(request, CONNECT_SECONDS)
            response = await super().handle_async_request(request)
        except Exception as exc:
            _record(attempt, exc, refused=isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout,
                                                           reach.Problem)))
            raise
        return reach.capped(response, lambda: _record(attempt, reach.TooLong()))


def _record(attempt: _Attempt | None, exc: BaseException, refused: bool = False) -> None:
    why = reach.category(exc)
    log.info("MCP: %s (%s)", why, redact(_describe(exc)))
    if attempt is not None:
        attempt.problem = attempt.problem or why
        attempt.refused = attempt.refused or refused


@dataclass
class _Connection:
    """An open client, owned by a task of its own (an anyio task group must be left by the
    task that entered it): `closing` set, the owner leaves the client and ends."""

    spec: ServerSpec
    client: Client
    owner: asyncio.Task[None]
    closing: asyncio.Event
    opening: _Attempt
    tasks: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return not self.owner.done()


def _transport(spec: ServerSpec) -> AbstractAsyncContextManager[TransportStreams]:
    if spec.transport == "stdio":
        command = list(spec.command)
        if not command:
            raise reach.Problem("command failed")
        return bounded_stdio(command, dict(spec.env), _attempt.get())
    http = httpx2.AsyncClient(headers=dict(spec.headers), transport=_GuardedTransport(spec), trust_env=False,
                              timeout=httpx2.Timeout(CONNECT_SECONDS, read=max(spec.timeout, 1.0) + 5))
    return streamable_http_client(spec.url, http_client=http, max_sse_event_size=reach.MAX_ANSWER_BYTES + 1024)


class Hub:
    """The process's MCP connections, on their own event loop."""

    def __init__(self, on_list_changed: Callable[[int], object] | None = None) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: dict[int, _Connection] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self.on_list_changed = on_list_changed  # callable(server pk), run on a thread

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcp-client", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], deadline: float) -> T:
        """Run `coro` on the hub's loop; wait at most `deadline` seconds for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(deadline)
        except TimeoutError:
            future.cancel()
            raise

    # --- on the hub's loop ------------------------------------------------------------------

    async def _connection(self, spec: ServerSpec) -> _Connection:
        current = self._connections.get(spec.pk)
        if current is not None and current.spec == spec and current.alive:
            return current
        lock = self._opening.setdefault(spec.pk, asyncio.Lock())
        async with lock:
            current = self._connections.get(spec.pk)
            if current is not None and current.spec == spec and current.alive:
                return current
            if current is not None:
                await self._drop(spec.pk)
            return await self._open(spec)

    async def _open(self, spec: ServerSpec) -> _Connection:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Client] = loop.create_future()
        closing = asyncio.Event()
        # The connection's own attempt: what its transport's tasks (started by the owner,
        # in its context) record — the handshake's failure, a stdio line too long.
        opening, context = _Attempt(), contextvars.copy_context()
        context.run(_attempt.set, opening)
        owner = loop.create_task(self._own(spec, ready, closing), context=context)
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), spec.open_seconds)
        except BaseException as exc:
            closing.set()
            owner.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
            why = opening.problem or ("timed out" if isinstance(exc, TimeoutError) else reach.category(exc))
            log.info("MCP server %s: %s", spec.name, redact(_describe(exc), spec.secrets()))
            raise Unreachable(unreachable(spec, why)) from None
        connection = _Connection(spec, client, owner, closing, opening)
        self._connections[spec.pk] = connection
        if client.protocol_version in mcp_types.version.MODERN_PROTOCOL_VERSIONS:
            connection.tasks.append(asyncio.ensure_future(self._listen(connection)))
        return connection

    async def _own(self, spec: ServerSpec, ready: asyncio.Future[Client], closing: asyncio.Event) -> None:
        try:
            async with Client(_transport(spec), read_timeout_seconds=spec.timeout, cache=None,
                              message_handler=self._message_handler(spec.pk)) as client:
                ready.set_result(client)
                await closing.wait()
        except BaseException as exc:  # the transport died: the connection is gone
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(type(exc).__name__))
            elif not isinstance(exc, asyncio.CancelledError):
                log.info("MCP server %s: connection closed (%s)", spec.name, type(exc).__name__)

    def _message_handler(self, pk: int) -> MessageHandlerFnT:
        async def handle(message: IncomingMessage) -> None:  # a 2025-era server's notifications
            if isinstance(message, mcp_types.ServerNotification) and \
                    isinstance(message.root if hasattr(message, "root") else message,
                               mcp_types.ToolListChangedNotification):
                self._changed(pk)
        return handle

    async def _listen(self, connection: _Connection) -> None:
        """A 2026-era server's `subscriptions/listen` stream of tools/list_changed."""
        try:
            async with connection.client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._changed(connection.spec.pk)
        except Exception as exc:  # not offered, or the stream dropped: the schedule still refreshes
            log.debug("MCP server %s: no list_changed stream (%s)", connection.spec.name, type(exc).__name__)

    def _changed(self, pk: int) -> None:
        if self.on_list_changed is not None:
            asyncio.get_running_loop().run_in_executor(None, self.on_list_changed, pk)

    async def _drop(self, pk: int) -> None:
        connection = self._connections.pop(pk, None)
        if connection is not None:
            for task in connection.tasks:
                task.cancel()
            connection.closing.set()
            try:
                await asyncio.wait_for(connection.owner, 2)
            except BaseException as exc:  # a transport that died mid-way may fail its own cleanup
                if isinstance(exc, asyncio.CancelledError) and not connection.owner.cancelled():
                    raise
                log.debug("closing MCP connection %s: %s", connection.spec.name, type(exc).__name__)

    async def _list(self, spec: ServerSpec) -> list[mcp_types.Tool]:
        attempt = _Attempt()
        _attempt.set(attempt)
        connection = await self._connection(spec)
        try:
            tools: list[mcp_types.Tool] = []
            cursor: str | None = None
            for _ in range(20):
                page = await connection.client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools
        except Exception as exc:
            await self._drop(spec.pk)
            log.info("MCP server %s did not list its tools: %s", spec.name, redact(_describe(exc), spec.secrets()))
            raise Unreachable(unreachable(spec, attempt.problem or connection.opening.problem
                                          or reach.category(exc))) from None

    async def _call(self, spec: ServerSpec, name: str, arguments: dict[str, Any],
                    meta: dict[str, Any] | None) -> mcp_types.CallToolResult:
        attempt = _Attempt()
        _attempt.set(attempt)
        connection = await self._connection(spec)
        try:
            with anyio.fail_after(spec.timeout):
                # RequestParamsMeta is an open map (extra_items=Any), which mypy cannot read yet.
                return await connection.client.call_tool(name, arguments,
                                                         meta=cast("mcp_types.RequestParamsMeta | None", meta))
        except MCPError as exc:
            if exc.code not in (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT):
                raise ServerError(redact(f"{spec.name}: {str(exc)[:1000]}", spec.secrets())) from None
            await self._drop(spec.pk)
            failure: Exception = exc
        except TimeoutError:
            await self._drop(spec.pk)
            raise AnswerLost(f"no answer from MCP server {spec.name} within {spec.timeout:g} s") from None
        except Exception as exc:  # the transport failed under the call
            await self._drop(spec.pk)
            failure = exc
        log.info("MCP server %s, %s: %s", spec.name, name, redact(_describe(failure), spec.secrets()))
        why = attempt.problem or connection.opening.problem or reach.category(failure)
        if attempt.refused:
            raise Unreachable(unreachable(spec, why))
        raise AnswerLost(f"the connection to MCP server {spec.name} was lost during the call: {why}")

    # --- from any thread ---------------------------------------------------------------------

    def list_tools(self, spec: ServerSpec, deadline: float | None = None) -> list[mcp_types.Tool]:
        deadline = deadline or spec.open_seconds + spec.timeout
        try:
            return self.run(self._list(spec), deadline)
        except TimeoutError:
            self.forget(spec.pk)
            raise Unreachable(unreachable(spec, "timed out")) from None

    def call(self, spec: ServerSpec, name: str, arguments: dict[str, Any],
             meta: dict[str, Any] | None = None) -> mcp_types.CallToolResult:
        """The server's CallToolResult; raises Unreachable, AnswerLost or ServerError."""
        started = time.monotonic()
        try:
            # The hub's own deadline (fail_after) ends the call; this one is the overall bound
            # (connecting included), a little later so the hub's verdict comes first.
            return self.run(self._call(spec, name, arguments, meta), spec.open_seconds + spec.timeout + 2)
        except TimeoutError:
            self.forget(spec.pk)
            raise AnswerLost(f"no answer from MCP server {spec.name} within "
                             f"{time.monotonic() - started:.0f} s") from None

    def forget(self, pk: int) -> None:
        """Close a server's connection (its row changed or was deleted)."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._drop(pk), self._loop)


def unreachable(spec: ServerSpec, why: str) -> str:
    """What operators read (the admin, the row's last error): a category, no text of the server's."""
    return f"MCP server {spec.name} is unreachable: {why}"


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500]

