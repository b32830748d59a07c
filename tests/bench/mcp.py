"""The guard's added latency on an MCP server's tool: `desk__create_ticket` through
`guard.invoke` (policy lookup, fingerprint, claim INSERT, the call over the process's
MCP connection, confirm UPDATE) against the same MCP call made directly with the SDK's
Client on a connection of its own, interleaved call by call, every call a new ticket.
The MCP server is the tests' ticket desk (tests/fakes/mcp_tickets.py) in its own process."""

import asyncio
import threading
import time

import httpx
from mcp import Client


def bench_mcp(kit, n=500, warmup=50):
    """`kit`: the runner's helpers (report, start, stop, wait_until, free_port, percentile, LOGS)."""
    from tools import guard
    from tools.mcp import catalog
    from tools.models import McpServer
    from tools.registry import Scope

    report, start, stop, wait_until, percentile = kit.report, kit.start, kit.stop, kit.wait_until, kit.percentile
    free_port = kit.free_port
    log = kit.LOGS / "mcp-tickets-executions.jsonl"
    log.unlink(missing_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    desk = start("mcp-tickets", [".venv/bin/python", "-m", "tests.fakes.mcp_tickets", "--port", str(port),
                                 "--log", str(log)])
    try:
        wait_until(lambda: _answers(url), 30, "the MCP ticket desk")
        server = McpServer.objects.create(name="bench", url=url)
        catalog.refresh(server)
        guard.forget_policies()
        scope = Scope("contact:bench-mcp")
        direct = DirectClient(url)
        guarded_ms, direct_ms = [], []
        for i in range(warmup + n):
            began = time.perf_counter()
            outcome = guard.invoke("bench__create_ticket", {"subject": f"guarded {i}"}, scope, actor="bench")
            guarded = (time.perf_counter() - began) * 1000
            assert outcome.status == "done", outcome
            began = time.perf_counter()
            result = direct.call("create_ticket", {"subject": f"direct {i}"})
            bare = (time.perf_counter() - began) * 1000
            assert not result.is_error, result
            if i >= warmup:
                guarded_ms.append(guarded)
                direct_ms.append(bare)
        direct.close()
    finally:
        stop(desk)
    p50, p99 = percentile(guarded_ms, 50), percentile(guarded_ms, 99)
    d50, d99 = percentile(direct_ms, 50), percentile(direct_ms, 99)
    report("mcp", f"MCP tool through the guard p50 {p50:.2f} ms / p99 {p99:.2f} ms vs the same call with the SDK "
                  f"directly p50 {d50:.2f} ms / p99 {d99:.2f} ms over {n} calls each: added p50 {p50 - d50:.2f} ms, "
                  f"p99 {p99 - d99:.2f} ms (target: added p50 <= 2 ms on SQLite, <= 3 ms on PostgreSQL)")


class DirectClient:
    """The SDK's Client used from a synchronous caller the plain way: its own event loop on
    a thread, the client entered and left by one task (anyio's rule), calls submitted to it."""

    def __init__(self, url):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.ready = asyncio.run_coroutine_threadsafe(self._ready_future(), self.loop).result(5)
        self.closing = asyncio.run_coroutine_threadsafe(self._event(), self.loop).result(5)
        self.owner = asyncio.run_coroutine_threadsafe(self._own(url), self.loop)
        self.client = asyncio.run_coroutine_threadsafe(self._wait_ready(), self.loop).result(10)

    async def _ready_future(self):
        return asyncio.get_running_loop().create_future()

    async def _event(self):
        return asyncio.Event()

    async def _wait_ready(self):
        return await self.ready

    async def _own(self, url):
        async with Client(url, cache=None) as client:
            self.ready.set_result(client)
            await self.closing.wait()

    def call(self, name, arguments):
        return asyncio.run_coroutine_threadsafe(self.client.call_tool(name, arguments), self.loop).result(30)

    def close(self):
        self.loop.call_soon_threadsafe(self.closing.set)
        self.owner.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _answers(url):
    try:
        httpx.get(url, timeout=1)
        return True
    except httpx.HTTPError:
        return False
