"""MCP servers as tool sources, end to end: the ticket desk (a real MCP server written
with the SDK's MCPServer) in a process of its own, the product's web and worker
processes, the openai agent driven by the local OpenAI-compatible fake."""

import json

import pytest
from django.core.management import call_command

from audit.models import AuditEvent, EventKind
from tests.conftest import wait_until
from tests.end_to_end.test_secrets import dump_database, leaks
from tests.fakes.openai_api import FakeOpenAI, Reply, ToolCalls
from tests.support.e2e import send, telegram_channel
from tests.support.mcp_helpers import HEADER_SECRET, TicketDesk, register
from tools import approvals, guard
from tools.models import ActionClaim, ClaimState, McpTool, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.e2e
KEY_ENV = {"FAKE_OPENAI_API_KEY": "sk-test-agentloop"}
CREATE = "desk__create_ticket"


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def desk(processes, tmp_path):
    return TicketDesk(processes, tmp_path).start()


def openai_channel(make_channel, fake_telegram, fake_openai):
    return telegram_channel(make_channel, fake_telegram, agent="openai", agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})


def tool_results(request):
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


def test_the_incident_with_an_mcp_tool_runs_once(processes, make_channel, fake_telegram, fake_openai, desk):
    openai_channel(make_channel, fake_telegram, fake_openai)
    register(desk, "tg")
    # The default fingerprint of an MCP tool is all its arguments: the operator names the identity.
    call_command("toolpolicy", CREATE, fingerprint=["subject"])
    fake_openai.script(
        ToolCalls([(CREATE, {"subject": "Printer on fire"})]), Reply("Ticket opened."),
        ToolCalls([(CREATE, {"subject": "Printer on fire", "priority": "high"})]), Reply("It was already open."),
    )
    web, worker = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "The printer is on fire, open a ticket.")
    fake_telegram.wait_for("sendMessage", timeout=20)
    send(web, "tg", 101, "Open a ticket for the printer, high priority!")
    second = fake_telegram.wait_for("sendMessage", count=2, timeout=20)[1]

    assert second.params["text"] == "It was already open.", [c.params["text"] for c in fake_telegram.calls("sendMessage")] + [worker.output()[-3000:]]
    assert len(desk.executions()) == 1
    requests = fake_openai.requests()
    assert {CREATE, "desk__find_ticket", "calendar_create_event"} <= {t["function"]["name"] for t in requests[0].tools}
    [done] = tool_results(requests[1])
    assert done["status"] == "done" and done["result"] == {"ticket": 1, "subject": "Printer on fire"}
    [duplicate] = tool_results(requests[3])
    assert duplicate["duplicate"] and "already carried out" in duplicate["note"]
    assert duplicate["original"]["result"] == {"ticket": 1, "subject": "Printer on fire"}
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 1


def test_annotations_are_hints_trusted_only_for_a_trusted_server(db, processes, make_channel, desk):
    make_channel("tg")
    register(desk, "tg")
    policies = {p.name: p for p in ToolPolicy.objects.filter(name__startswith="desk__")}
    assert policies["desk__find_ticket"].guarded  # readOnlyHint from an untrusted server: still guarded
    assert policies["desk__close_all_tickets"].approval == "operator"  # destructiveHint: approval
    assert policies[CREATE].guarded and policies[CREATE].approval == "none" and policies[CREATE].fingerprint_fields == []
    assert McpTool.objects.get(offered_as="desk__find_ticket").hints() == "readOnlyHint=True"
    ToolPolicy.objects.filter(name__startswith="desk__").delete()
    guard.forget_policies()
    register(desk, "tg", name="desk", trusted=True)
    assert not ToolPolicy.objects.get(name="desk__find_ticket").guarded


def test_a_call_killed_before_its_answer_is_uncertain_never_rerun_and_reconciled(processes, make_conversation,
                                                                                make_channel, desk):
    conversation = make_conversation(make_channel("tg"))
    server = register(desk, "tg", timeout=20)
    scope = Scope.of_conversation(conversation)
    desk.hang_next()
    arguments = {"subject": "Lost answer"}
    import threading

    outcome = {}
    caller = threading.Thread(target=lambda: outcome.update(o=guard.invoke(CREATE, arguments, scope, actor="test")))
    caller.start()
    wait_until(lambda: desk.executions(), timeout=15, message="the desk received the call")
    desk.proc.kill()  # after it ran, before it answered
    caller.join(30)
    assert outcome["o"].status == "uncertain" and "may have happened" in outcome["o"].note
    claim = ActionClaim.objects.get(action=CREATE)
    assert claim.state == ClaimState.UNCERTAIN
    # Restarted, the same call is not run again: without a way to look it up, the model hears "maybe".
    desk.hang_next(False)
    desk.start()
    again = guard.invoke(CREATE, arguments, scope, actor="test")
    assert again.status == "uncertain" and again.duplicate and len(desk.executions()) == 1
    # The operator names the read-only tool that looks it up: the next look reconciles it.
    McpTool.objects.filter(server=server, name="create_ticket").update(reconcile_with="find_ticket")
    guard.sweep()
    third = guard.invoke(CREATE, arguments, scope, actor="test")
    claim.refresh_from_db()
    assert claim.state == ClaimState.DONE and claim.result["ticket"] == 1
    assert third.status == "duplicate" and len(desk.executions()) == 1


def test_a_destructive_tool_waits_for_an_apply_and_runs_once(processes, make_conversation, make_channel, desk):
    conversation = make_conversation(make_channel("tg"))
    register(desk, "tg")
    outcome = guard.invoke("desk__close_all_tickets", {}, Scope.of_conversation(conversation), actor="test")
    assert outcome.status == "awaiting_approval" and desk.executions("close_all_tickets") == []
    for _ in range(3):
        approvals.apply(outcome.proposal_id, by="operator")
    assert len(desk.executions("close_all_tickets")) == 1


def test_a_server_that_is_down_leaves_its_tools_out_with_a_note(processes, make_channel, fake_telegram, fake_openai,
                                                                tmp_path):
    openai_channel(make_channel, fake_telegram, fake_openai)
    down = TicketDesk(processes, tmp_path)  # never started: its port refuses
    register(down, "tg")
    fake_openai.script(Reply("I can't open tickets right now."))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Open a ticket please.")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=20)
    assert reply.params["text"] == "I can't open tickets right now."
    [request] = fake_openai.requests()
    names = {t["function"]["name"] for t in request.tools}
    assert "calendar_create_event" in names and not any(n.startswith("desk__") for n in names)
    assert any(m["role"] == "system" and "tools of desk are unavailable" in m["content"] for m in request.messages)


@pytest.fixture
def openai_tg(make_channel, fake_telegram, fake_openai):
    """Channel `tg`: Telegram in, the openai agent on the fake: (fake Bot API, fake model)."""
    openai_channel(make_channel, fake_telegram, fake_openai)
    return fake_telegram, fake_openai


def test_header_secrets_never_reach_the_dump_logs_or_api(processes, openai_tg, desk, admin_client):
    fake_telegram, fake_openai = openai_tg
    register(desk, "tg")
    down = TicketDesk(processes, desk.log.parent)  # its error (stored, logged) is written beside the secret
    register(down, "tg", name="down")
    fake_openai.script(ToolCalls([(CREATE, {"subject": "Printer"})]), Reply("done"))
    web, worker = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Open a ticket.")
    fake_telegram.wait_for("sendMessage", timeout=20)
    from tools.models import McpServer

    assert McpServer.objects.get(name="down").last_error
    dump = "\n".join(line for line in dump_database().splitlines() if not line.startswith("tools_mcpserver:"))
    assert leaks(dump, [HEADER_SECRET]) == []
    assert leaks(worker.output() + web.output(), [HEADER_SECRET]) == []
    assert leaks(json.dumps(fake_openai.requests()[1].messages), [HEADER_SECRET]) == []
    page = admin_client.get(f"/admin/tools/mcpserver/{register(desk, 'tg').pk}/change/").content.decode()
    assert "X-Desk-Key" in page and HEADER_SECRET not in page


def test_a_stdio_server_is_listed_and_called_behind_the_guard(db, make_conversation, make_channel, tmp_path):
    import sys

    from tests.conftest import BASE_DIR

    conversation = make_conversation(make_channel("tg"))
    log = tmp_path / "stdio.log"
    call_command("addmcpserver", "local", command=f"{sys.executable} {BASE_DIR / 'tests/fakes/mcp_tickets.py'} "
                                                  f"--stdio --log {log}", env=[("DESK_TOKEN", "stdio-env-Secret-1")],
                 channel=["tg"])
    assert McpTool.objects.filter(server__name="local", present=True).count() == 4
    scope = Scope.of_conversation(conversation)
    first = guard.invoke("local__create_ticket", {"subject": "Via stdio"}, scope, actor="test")
    second = guard.invoke("local__create_ticket", {"subject": "Via stdio"}, scope, actor="test")
    assert first.status == "done" and second.status == "duplicate"
    assert len(log.read_text().splitlines()) == 1


def test_tools_list_changed_refreshes_the_listing(processes, make_conversation, make_channel, desk):
    conversation = make_conversation(make_channel("tg"))
    register(desk, "tg")
    assert not McpTool.objects.filter(name="escalate_ticket").exists()
    outcome = guard.invoke("desk__enable_escalation", {}, Scope.of_conversation(conversation), actor="test")
    assert outcome.status == "done"
    wait_until(lambda: McpTool.objects.filter(offered_as="desk__escalate_ticket", present=True).exists(),
               timeout=10, message="the new tool listed after tools/list_changed")
