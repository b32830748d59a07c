"""The web server's access log never writes a secret: the web process started as the
Procfile and `make run` (manage.py runall, ACCESS_LOG=true) start it, asked for URLs that
carry one — WhatsApp's verify handshake (`hub.verify_token=`), a calendar's feed token,
a signed file link — writes each request's line with the secret masked."""

import shlex
import sys

import pytest

from agentloop.core.redaction import MASK
from conversations.management.commands import runall
from tests.conftest import BASE_DIR, WebProcess, free_port, wait_until
from tests.support import local_http
from tools.models import Calendar

VERIFY_TOKEN = "wa-verify-Token-58211"
SIGNED_FILE_TOKEN = "signedFileLink0123456789abcdef"


def procfile_web(port) -> list:
    """The Procfile's `web:` line, as a shell would run it on this port."""
    line = next(line for line in (BASE_DIR / "Procfile").read_text().splitlines() if line.startswith("web:"))
    args = shlex.split(line.removeprefix("web:").replace("${PORT:-8000}", str(port)).replace("0.0.0.0", "127.0.0.1"))
    return [sys.executable if arg == "python" else arg for arg in args]


def runall_web(port, monkeypatch) -> list:
    monkeypatch.setenv("ACCESS_LOG", "true")
    return runall.processes("127.0.0.1", port)["web"]


@pytest.mark.parametrize("started_by", ["Procfile", "runall"])
def test_access_log_lines_carry_no_secret(processes, started_by, monkeypatch):
    calendar = Calendar.objects.create(scope="ana")
    port = free_port()
    args = procfile_web(port) if started_by == "Procfile" else runall_web(port, monkeypatch)
    web = processes.start("web", args, kind=WebProcess)
    web.base_url = f"http://127.0.0.1:{port}"

    handshake = f"/webhooks/whatsapp/nobody/?hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=42"
    local_http.get(web.url + handshake)
    feed = local_http.get(f"{web.url}/calendars/{calendar.feed_token}.ics")
    assert feed.status_code == 200
    local_http.get(f"{web.url}/files/{SIGNED_FILE_TOKEN}")

    wait_until(lambda: "/files/" in web.output(), timeout=10, message="the access log's lines")
    log = web.output()
    assert "/webhooks/whatsapp/nobody/?hub.mode=subscribe" in log and "hub.challenge=42" in log
    assert f"hub.verify_token={MASK}" in log
    assert f"/calendars/{MASK}.ics" in log and f"/files/{MASK}" in log
    for secret in (VERIFY_TOKEN, calendar.feed_token, SIGNED_FILE_TOKEN):
        assert secret not in log, log


def test_behind_a_trusted_proxy_each_line_names_the_client(processes):
    """The Procfile's web process behind a proxy it trusts (AGENTLOOP_TRUSTED_PROXIES): a line
    names the client the proxy forwarded for, not the proxy (issue 51, finding 11b)."""
    port = free_port()
    web = processes.start("web", procfile_web(port), kind=WebProcess, AGENTLOOP_TRUSTED_PROXIES="127.0.0.1")
    web.base_url = f"http://127.0.0.1:{port}"
    local_http.get(f"{web.url}/healthz?from=client", headers={"X-Forwarded-For": "203.0.113.7"})
    line = wait_until(lambda: next((line for line in web.output().splitlines() if "from=client" in line), None),
                      timeout=10, message="the forwarded request's line")
    assert "203.0.113.7" in line and "127.0.0.1" not in line, line
