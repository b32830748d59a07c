"""agentloop as an MCP server: the SDK's own client against `/mcp` on the real web
process (daphne), with agent keys."""

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tools.models import ActionClaim, CalendarEvent

pytestmark = pytest.mark.e2e
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}


def client(web, key, path="/mcp"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # The SDK's own client defaults, with a 30 s read bound: the first /mcp request loads the
    # SDK in the web process, which on a busy 2-core machine is more than httpx's 5 s.
    http = create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(30))
    return Client(streamable_http_client(f"{web.url}{path}", http_client=http))


def run(coro_fn):
    return anyio.run(coro_fn)


def test_lists_tools_with_a_key_and_refuses_without_one_or_another_channels(processes, make_channel, agent_key):
    mine, other = make_channel("mine"), make_channel("other")
    key, others_key = agent_key(mine), agent_key(other, name="other")
    web = processes.web()

    async def listed(k, path="/mcp"):
        async with client(web, k, path) as c:
            return {t.name: t for t in (await c.list_tools()).tools}

    tools = run(lambda: listed(key))
    assert {"calendar_create_event", "calendar_list_events", "email_send", "guard_claim", "guard_succeed",
            "guard_fail"} <= set(tools)
    assert tools["calendar_list_events"].annotations.read_only_hint is True
    assert tools["calendar_create_event"].annotations.idempotent_hint is True
    assert tools["calendar_delete_event"].annotations.destructive_hint is True
    assert run(lambda: listed(key, "/mcp/mine"))
    for refused in (lambda: listed(None), lambda: listed("not-a-key"), lambda: listed(others_key, "/mcp/mine")):
        with pytest.raises(Exception):  # noqa: B017 — the SDK raises its transport's error
            run(refused)
    raw = httpx2.post(f"{web.url}/mcp", json={}, headers={"Authorization": f"Bearer {others_key}"}).status_code
    assert raw != 401  # a valid key is let through to the protocol
    assert httpx2.post(f"{web.url}/mcp/mine", json={}, headers={"Authorization": f"Bearer {others_key}"}
                       ).status_code == 403
    assert httpx2.post(f"{web.url}/mcp", json={}).status_code == 401


def test_calendar_create_event_twice_is_one_event_and_a_duplicate(processes, make_channel, make_conversation,
                                                                  agent_key):
    channel, other = make_channel("mine"), make_channel("other")
    conversation, elsewhere = make_conversation(channel), make_conversation(other, contact="bea")
    key = agent_key(channel)
    web = processes.web()

    async def twice():
        async with client(web, key) as c:
            meta = {"io.agentloop/conversation": conversation.pk}
            first = await c.call_tool("calendar_create_event", EVENT, meta=meta)
            second = await c.call_tool("calendar_create_event", {**EVENT, "end_datetime": "2026-12-01T11:00"},
                                       meta=meta)
            refused = await c.call_tool("calendar_create_event", EVENT,
                                        meta={"io.agentloop/conversation": elsewhere.pk})
            return first, second, refused

    first, second, refused = run(twice)
    assert not first.is_error and first.structured_content["status"] == "done"
    assert not second.is_error and second.structured_content["duplicate"] is True
    assert "already carried out" in second.structured_content["note"]
    assert second.structured_content["original"]["result"] == first.structured_content["result"]
    assert refused.is_error and "no conversation" in refused.structured_content["error"]
    assert CalendarEvent.objects.count() == 1


def test_guard_claim_succeed_then_a_repeat_claim_is_a_duplicate_with_the_result(processes, make_channel, agent_key):
    key = agent_key(make_channel("mine"))
    web = processes.web()
    claim_args = {"action": "refund", "arguments": {"order": "A-17", "amount": 30}, "scope": "customer-9",
                  "fingerprint": ["order"]}

    async def flow():
        async with client(web, key) as c:
            claimed = (await c.call_tool("guard_claim", claim_args)).structured_content
            done = (await c.call_tool("guard_succeed", {"claim": claimed["claim"], "result": {"refund": "R-1"}}))
            again = (await c.call_tool("guard_claim", {**claim_args, "arguments": {"order": "A-17", "amount": 31}}))
            failed = await c.call_tool("guard_fail", {"claim": 999999, "error": "x"})
            return claimed, done.structured_content, again.structured_content, failed

    claimed, done, again, failed = run(flow)
    assert claimed["status"] == "proceed" and claimed["claim"]
    assert done["state"] == "done" and done["result"] == {"refund": "R-1"}
    assert again["duplicate"] is True and again["status"] == "duplicate"
    assert again["result"] == {"refund": "R-1"} and "already carried out" in again["note"]
    assert failed.is_error
    assert ActionClaim.objects.filter(action__endswith=":refund").count() == 1
