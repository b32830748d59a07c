"""The pages tests.bench.grown times: the story page of the long conversation, every
admin changelist of the big tables with its common filters and search, and the
dashboard's snapshot over its websocket, each on both databases through real HTTP with
a logged-in staff session (the admin's login form, as a person signs in)."""

import asyncio
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp
import httpx

from tests.bench import prefill

STORY, CHANGELIST, SNAPSHOT = 300, 300, 200  # targets, ms


@dataclass
class Page:
    label: str
    target: int
    empty_ms: float = 0.0
    grown_ms: float = 0.0
    note: str = ""


def changelists():
    """(label, path): each big table's changelist, its filters and its search."""
    day = datetime.now(UTC) - timedelta(days=2)
    ymd = f"__year={day.year}&{{f}}__month={day.month}&{{f}}__day={day.day}"
    return [
        ("conversations", "/admin/conversations/conversation/"),
        ("conversations of a channel", "/admin/conversations/conversation/?channel__id__exact=1"),
        ("conversations, search a chat id", "/admin/conversations/conversation/?q=5123456"),
        ("messages", "/admin/conversations/inboundmessage/"),
        ("messages of a channel", "/admin/conversations/inboundmessage/?channel__id__exact=1"),
        ("messages, disposition rejected", "/admin/conversations/inboundmessage/?disposition__exact=rejected"),
        ("messages, kind media", "/admin/conversations/inboundmessage/?kind__exact=media"),
        ("messages of one day", "/admin/conversations/inboundmessage/?received_at" + ymd.format(f="received_at")),
        ("messages of a conversation", "/admin/conversations/inboundmessage/?conversation__id__exact=1"),
        ("messages, search a word", "/admin/conversations/inboundmessage/?q=agendar"),
        ("messages, search a message id", "/admin/conversations/inboundmessage/?q=g123457"),
        ("turns", "/admin/conversations/turn/"),
        ("turns, state failed", "/admin/conversations/turn/?state__exact=failed"),
        ("turns of a channel", "/admin/conversations/turn/?conversation__channel__id__exact=1"),
        ("turns, flushed at max wait", "/admin/conversations/turn/?flush_reason__exact=max_wait"),
        ("turns of one day", "/admin/conversations/turn/?created_at" + ymd.format(f="created_at")),
        ("turns, search", "/admin/conversations/turn/?q=martes+123457"),
        ("ledger rows", "/admin/delivery/outboundmessage/"),
        ("ledger rows, state unreachable", "/admin/delivery/outboundmessage/?state__exact=unreachable"),
        ("ledger rows of a channel", "/admin/delivery/outboundmessage/?channel__id__exact=1"),
        ("ledger rows, last 24 hours", "/admin/delivery/outboundmessage/?age=24h"),
        ("ledger rows of a conversation", "/admin/delivery/outboundmessage/?conversation__id__exact=1"),
        ("ledger rows to a chat", "/admin/delivery/outboundmessage/?chat_id=5000001"),
        ("ledger rows, search", "/admin/delivery/outboundmessage/?q=5012345"),
        ("audit events", "/admin/audit/auditevent/"),
        ("audit events, kind duplicate", "/admin/audit/auditevent/?kind__exact=duplicate_prevented"),
        ("audit events of a channel", "/admin/audit/auditevent/?channel_slug__exact=grown-api"),
        ("audit events of a conversation", "/admin/audit/auditevent/?conversation_id=1"),
        ("audit events of one day", "/admin/audit/auditevent/?at" + ymd.format(f="at")),
        ("audit events, search a target", "/admin/audit/auditevent/?q=turn+123457"),
        ("caught duplicates", "/admin/audit/caughtduplicate/"),
        ("claims", "/admin/tools/actionclaim/"),
        ("claims, state uncertain", "/admin/tools/actionclaim/?state__exact=uncertain"),
        ("claims, action email_send", "/admin/tools/actionclaim/?action__exact=email_send"),
        ("claims, live", "/admin/tools/actionclaim/?live__exact=1"),
        ("claims of a conversation", "/admin/tools/actionclaim/?conversation_id=1"),
        ("claims, search a scope", "/admin/tools/actionclaim/?q=contact%3A5123"),
    ]


def login(base) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=120)
    client.get("/admin/login/")
    answer = client.post("/admin/login/?next=/admin/", data={
        "username": prefill.STAFF[0], "password": prefill.STAFF[1], "next": "/admin/",
        "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    if answer.status_code != 302 or "sessionid" not in client.cookies:
        raise SystemExit(f"could not sign in at {base}: {answer.status_code}")
    return client


def timed_get(client, path) -> float:
    began = time.perf_counter()
    answer = client.get(path)
    took = (time.perf_counter() - began) * 1000
    if answer.status_code != 200:
        raise SystemExit(f"GET {path}: {answer.status_code} {answer.text[:300]}")
    return took


async def _snapshot(base, cookies) -> float:
    async with aiohttp.ClientSession(cookies=cookies) as session:
        began = time.perf_counter()
        async with session.ws_connect(base.replace("http", "ws", 1) + "/ws/console/dashboard/",
                                      origin=base, timeout=aiohttp.ClientWSTimeout(ws_close=10)) as socket:
            while (await socket.receive_json(timeout=60)).get("type") != "snapshot":
                pass
            return (time.perf_counter() - began) * 1000


def snapshot_ms(base, client) -> float:
    """From opening the dashboard's websocket to its snapshot (the picture the page shows)."""
    return asyncio.run(_snapshot(base, {"sessionid": client.cookies["sessionid"]}))


def measure(bases, rounds) -> list[Page]:
    """Each page on both databases: one warm-up, then `rounds` interleaved GETs; medians."""
    clients = {name: login(base) for name, base in bases.items()}
    probes = [(Page("story page of the 5,000-message conversation", STORY,
                    note="reference: a 3-message conversation (the empty database's first)"),
               lambda name: timed_get(clients[name], f"/console/conversations/{prefill.BIG}/story/"))]
    probes.append((Page("dashboard snapshot (websocket)", SNAPSHOT, note="connect to the snapshot received"),
                   lambda name: snapshot_ms(bases[name], clients[name])))
    for label, path in changelists():
        probes.append((Page(f"admin: {label}", CHANGELIST, note=f"GET {path}"),
                       lambda name, path=path: timed_get(clients[name], path)))
    for page, probe in probes:
        times = {name: [] for name in bases}
        for name in bases:
            probe(name)  # warm: the first request of a kind pays for imports and templates
        for _ in range(rounds):
            for name in bases:
                times[name].append(probe(name))
        page.empty_ms, page.grown_ms = statistics.median(times["empty"]), statistics.median(times["grown"])
        print(f"  {page.label}: {page.grown_ms:.0f} ms grown, {page.empty_ms:.0f} ms empty", flush=True)
    for client in clients.values():
        client.close()
    return [page for page, _ in probes]
