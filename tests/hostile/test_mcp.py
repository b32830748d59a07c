"""Hostile input at /mcp (agentloop's tools served to agent keys) and from the MCP servers
we call (docs/security.md, docs/mcp.md): what an operator, an agent key or an MCP
server can send, and what holds. Real processes throughout: the web server (uvicorn),
the ticket desk (tests/fakes/mcp_tickets.py, the SDK's own server) over HTTP or stdio,
the admin through its login form.

- An operator cannot start a command (issue 51, finding 2): stdio servers are the
  machine holder's (`manage.py addmcpserver --command`), shown read-only in the admin,
  never started by a web request; an MCP URL is checked as a media URL is (no private,
  loopback or link-local address unless the machine holder allowed that URL), and what
  went wrong reaches the admin as a category, never the server's text.
- /mcp holds the web's bounds (finding 5): the body limit (413 before more is read,
  chunked too), the API's rate per key, and a claim's arguments and result capped.
- An MCP server's answers are read capped (finding 6): before parsing, over HTTP and
  stdio; a listed tool too big to offer is kept out, with its reason.
"""

import json
import socket
import sys
import threading
import time

import anyio
import httpx
import pytest
from django.core.management import call_command

from tests.conftest import BASE_DIR, free_port
from tests.end_to_end.test_guard_e2e import operator_session
from tests.end_to_end.test_mcp_server import client as mcp_client
from tests.fakes.file_server import FileServer
from tests.support.mcp_helpers import TicketDesk, register
from tools.mcp import catalog
from tools.mcp.client import Unreachable
from tools.models import ActionClaim, ClaimState, McpServer, McpTool, ToolPolicy

pytestmark = pytest.mark.e2e


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it (and answers none)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone leaves it listening)
        self.sock.close()


@pytest.fixture
def operator(processes):
    call_command("createuser", "olga", "--role", "operator", "--password", "pw-olga-1")
    web = processes.web()
    return operator_session(web, "olga", "pw-olga-1")


def server_form(session, **fields):
    """The admin's add/change form of an MCP server, as a browser posts it."""
    data = {"name": "evil", "transport": "http", "url": "", "headers": "{}", "enabled": "on",
            "timeout_seconds": "5", "max_result_bytes": "65536", "refresh_seconds": "300",
            "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0", "tools-MIN_NUM_FORMS": "0",
            "tools-MAX_NUM_FORMS": "1000", "csrfmiddlewaretoken": session.cookies["csrftoken"], **fields}
    return {k: v for k, v in data.items() if v is not None}


def admin_says(session, response) -> str:
    """The page the admin answered with, after its redirect (its messages on it)."""
    if response.status_code == 302:
        response = session.get(response.headers["location"])
    return response.text


# --- finding 2: an operator cannot run a command, nor probe the network ----------------------------


def test_an_operator_cannot_register_a_stdio_command(operator, tmp_path):
    ran = tmp_path / "ran"
    response = operator.post("/admin/tools/mcpserver/add/", data=server_form(
        operator, transport="stdio", command=json.dumps(["sh", "-c", f"env > {ran}"]), env="{}"))
    assert not ran.exists(), "the web process ran the operator's command"
    assert not McpServer.objects.exists(), response.text[-2000:]


def test_a_machine_holders_stdio_server_is_read_only_in_the_admin_and_never_started_there(processes, tmp_path):
    ran = tmp_path / "ran"
    call_command("addmcpserver", "local", command=f"sh -c 'touch {ran}'", no_list=True)
    server = McpServer.objects.get(name="local")
    call_command("createuser", "olga", "--role", "operator", "--password", "pw-olga-1")
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-1")
    web = processes.web()
    for name, password in (("olga", "pw-olga-1"), ("root", "pw-root-1")):
        session = operator_session(web, name, password)
        page = session.get(f"/admin/tools/mcpserver/{server.pk}/change/")
        assert page.status_code == 200 and "touch" in page.text  # shown, read-only
        changed = session.post(f"/admin/tools/mcpserver/{server.pk}/change/", data=server_form(
            session, name="local", transport="stdio", command=json.dumps(["sh", "-c", f"env > {ran}"])))
        assert changed.status_code == 403, (name, changed.status_code)
        deleted = session.post(f"/admin/tools/mcpserver/{server.pk}/delete/",
                               data={"post": "yes", "csrfmiddlewaretoken": session.cookies["csrftoken"]})
        assert deleted.status_code == 403, (name, deleted.status_code)
    server.refresh_from_db()
    assert server.command == ["sh", "-c", f"touch {ran}"]
    assert not ran.exists(), "a web request started the stdio server"


def test_an_mcp_url_to_a_private_address_is_not_connected_to(operator):
    listener = Listener()
    try:
        for url, said in ((f"https://localhost:{listener.port}/mcp", "not allowed: loopback address"),
                          (f"https://127.0.0.1:{listener.port}/mcp", "not allowed: loopback address"),
                          ("https://169.254.169.254/mcp", "not allowed: link-local address"),
                          ("https://10.1.2.3/mcp", "not allowed: private address")):
            McpServer.objects.all().delete()
            page = admin_says(operator, operator.post("/admin/tools/mcpserver/add/",
                                                      data=server_form(operator, url=url)))
            assert f"MCP server evil is unreachable: {said}" in page, (url, page[page.find("messagelist"):][:600])
            assert McpServer.objects.get(name="evil").last_error == f"MCP server evil is unreachable: {said}"
        assert listener.accepted == 0, "the web process connected to a loopback port an operator named"
        # Plain http carries the headers' secrets in the clear: only for a URL the machine holder allowed.
        page = operator.post("/admin/tools/mcpserver/add/", data=server_form(
            operator, name="plain", url="http://mcp.example.com/mcp")).text
        assert "https" in page and not McpServer.objects.filter(name="plain").exists()
    finally:
        listener.close()


def test_what_went_wrong_reaches_the_admin_as_a_category_not_a_text(operator, tmp_path):
    """Internal URLs the machine holder allowed (`--internal`): a closed port, a TLS
    server whose certificate is not trusted. The operator saving the server reads a
    category; the server's text and the library's stay in the process's log."""
    closed = free_port()  # nothing listens there: refused
    with FileServer() as files:
        for name, url, said in (("shut", f"http://127.0.0.1:{closed}/mcp", "refused"),
                                ("tls", files.url("/files/x"), "TLS error")):
            call_command("addmcpserver", name, url=url, internal=True, no_list=True)
            server = McpServer.objects.get(name=name)
            page = admin_says(operator, operator.post(f"/admin/tools/mcpserver/{server.pk}/change/", data=server_form(
                operator, name=name, url=url)))
            assert f"MCP server {name} is unreachable: {said}" in page, (name, page[page.find("messagelist"):][:600])
            server.refresh_from_db()
            assert server.last_error == f"MCP server {name} is unreachable: {said}"
            assert server.url == url and server.internal_url == url  # saved unchanged: still allowed


# --- finding 5: /mcp holds the web's bounds ----------------------------------------------------------

LIMIT = 4096  # AGENTLOOP_MAX_BODY_BYTES of the web server below
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def raw_post(web, key, chunks, *, length=None) -> bytes:
    """POST /mcp by hand: `chunks` sent chunked (never ended) unless `length` is given;
    the status line the server answers with, read while the body is still unfinished."""
    host, port = web.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                     f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                     f"{framing}\r\n\r\n".encode())
        try:
            for chunk in chunks:
                sock.sendall(chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server answered and closed while we were still sending: what we look for
        return sock.recv(200).split(b"\r\n", 1)[0]


def test_an_mcp_body_over_the_limit_is_refused_before_it_is_read(processes, make_channel, agent_key):
    key = agent_key(make_channel("mine"))
    web = processes.web(AGENTLOOP_MAX_BODY_BYTES=LIMIT)
    assert raw_post(web, key, [b"x" * 100], length=50 * LIMIT).startswith(b"HTTP/1.1 413")
    # Chunked, no length said, and never finished: refused once the limit is passed.
    assert raw_post(web, key, [b"x" * 1024] * 8).startswith(b"HTTP/1.1 413")
    small = httpx.post(f"{web.url}/mcp", json=CALL, timeout=30, headers={
        "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"})
    assert small.status_code == 200 and "guard_claim" in small.text


def test_mcp_requests_count_against_the_apis_rate_per_key(processes, make_channel, agent_key):
    channel = make_channel("mine")
    key, other = agent_key(channel), agent_key(channel, name="other")
    web = processes.web(AGENTLOOP_API_RATE="3/min")
    headers = {"Accept": "application/json, text/event-stream"}

    def post(k):
        return httpx.post(f"{web.url}/mcp", json=CALL, timeout=30, headers={**headers, "Authorization": f"Bearer {k}"})

    assert [post(key).status_code for _ in range(3)] == [200, 200, 200]
    refused = post(key)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    assert "rate" in refused.json()["error"]
    assert post(other).status_code == 200  # per key


def test_a_claims_arguments_and_result_are_capped(processes, make_channel, agent_key):
    key = agent_key(make_channel("mine"))
    web = processes.web()
    claim = {"action": "refund", "scope": "customer-9", "fingerprint": ["order"]}

    async def flow():
        async with mcp_client(web, key) as c:
            too_big = await c.call_tool("guard_claim", {**claim, "arguments": {"order": "A-1", "note": "x" * 70_000}})
            claimed = await c.call_tool("guard_claim", {**claim, "arguments": {"order": "A-2"}})
            done = await c.call_tool("guard_succeed", {"claim": claimed.structured_content["claim"],
                                                       "result": {"log": "y" * 100_000}})
            return too_big, done

    too_big, done = anyio.run(flow)
    assert too_big.is_error and "larger than 65536 bytes" in too_big.structured_content["error"]
    assert not ActionClaim.objects.filter(arguments__order="A-1").exists()
    stored = ActionClaim.objects.get(arguments__order="A-2")
    assert stored.state == ClaimState.DONE and not done.is_error
    assert stored.result["truncated"] is True and len(json.dumps(stored.result)) <= 65536 + 512


# --- finding 6: an MCP server's answers are read capped ------------------------------------------------


def test_a_listing_too_long_to_read_is_refused_over_http(processes, make_channel, tmp_path):
    make_channel("tg")
    desk = TicketDesk(processes, tmp_path, options=["--long-description", str(5_000_000)]).start()
    with pytest.raises(Unreachable, match=r"^MCP server desk is unreachable: bad answer \(longer than"):
        catalog.refresh(register(desk, "tg", no_list=True))
    assert not McpTool.objects.exists()
    assert McpServer.objects.get().last_error.startswith("MCP server desk is unreachable: bad answer")


def test_a_listing_too_long_to_read_is_refused_over_stdio(db, make_channel, tmp_path):
    make_channel("tg")
    call_command("addmcpserver", "local", command=f"{sys.executable} {BASE_DIR / 'tests/fakes/mcp_tickets.py'} "
                                                  f"--stdio --log {tmp_path / 'stdio.log'} --long-description 5000000",
                 channel=["tg"], no_list=True)
    started = time.monotonic()
    with pytest.raises(Unreachable, match=r"^MCP server local is unreachable: bad answer \(longer than"):
        catalog.refresh(McpServer.objects.get())
    assert time.monotonic() - started < 30
    assert not McpTool.objects.exists()


def test_a_stdio_server_slower_to_start_than_a_connect_is_still_listed(db, make_channel, tmp_path):
    """A stdio server is a process to start: on a loaded machine its interpreter may take
    longer than an HTTP connect's 5 s (CI once took over 5 s to import the SDK's server)."""
    make_channel("tg")
    server = BASE_DIR / "tests/fakes/mcp_tickets.py"
    call_command("addmcpserver", "slow", command=f"sh -c 'sleep 5.5; exec {sys.executable} {server} --stdio "
                                                  f"--log {tmp_path / 'stdio.log'}'",
                 channel=["tg"], no_list=True)
    catalog.refresh(McpServer.objects.get())
    assert McpTool.objects.filter(name="create_ticket", refused="").exists()
    assert McpServer.objects.get().last_error == ""


def test_a_tool_too_big_to_offer_is_kept_out_with_its_reason(processes, make_channel, tmp_path):
    channel = make_channel("tg")
    desk = TicketDesk(processes, tmp_path, options=["--long-description", "10000", "--wide-schema", "20000"]).start()
    register(desk, "tg")
    rows = {row.name: row for row in McpTool.objects.all()}
    assert rows["long_winded"].refused == "its description is longer than 4000 characters"
    assert rows["wide_schema"].refused.startswith("its input schema is larger than 16384 bytes")
    assert rows["wide_schema"].input_schema == {} and rows["create_ticket"].refused == ""
    offered = {tool["function"]["name"] for tool in catalog.offered_to(channel.pk).tools}
    assert "desk__create_ticket" in offered and not offered & {"desk__long_winded", "desk__wide_schema"}
    assert catalog.tool("desk__wide_schema") is None
    assert not ToolPolicy.objects.filter(name__in=["desk__long_winded", "desk__wide_schema"]).exists()
