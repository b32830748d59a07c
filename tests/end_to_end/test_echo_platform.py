"""A new platform is one folder plus one setting (issue 52): tests/echo_platform/, written
from docs/adding-a-platform.md alone, is loaded by the real processes through
AGENTLOOP_EXTRA_PLATFORMS and gets everything the contract promises with no edit
elsewhere — `addchannel` takes its settings as options; its webhook is mounted, checked
in constant time and deduplicated; a burst is one turn; its replies go through the
ledger, paced, a 429 waited out and sent again; and the layers below reach it by the
setting alone (delivery's transport, redaction's secrets)."""

import sys

import pytest

from conversations.models import InboundMessage, Turn
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import run_python, wait_until
from tests.echo_platform.fake import EchoServer
from tests.support import local_http

pytestmark = pytest.mark.e2e

EXTRA = {"AGENTLOOP_EXTRA_PLATFORMS": "echo=tests.echo_platform.EchoPlatform"}
SECRET = "echo-s3cr3t-value"


def add_channel(processes, peer):
    command = [sys.executable, "manage.py", "addchannel", "echo1", "--kind", "echo", "--secret", SECRET,
               "--reply-url", peer.url("/replies"), "--agent", "echo",
               *[arg for kind in ("closed", "greeting", "open", "neutral") for arg in (f"--window-{kind}", "1.0")]]
    done = run_python(command, env=processes.env(**EXTRA), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def post(web, body, secret=SECRET):
    headers = {"X-Echo-Secret": secret} if secret is not None else {}
    return local_http.post(f"{web.url}/webhooks/echo/echo1/", json=body, headers=headers, timeout=10)


def test_a_platform_written_from_the_docs_is_one_folder_and_one_setting(processes):
    with EchoServer() as peer:
        add_channel(processes, peer)
        web = processes.web(wait=False, **EXTRA)
        processes.worker(**EXTRA)

        # Refused before anything is admitted: no secret, a wrong one, a body it cannot read.
        assert post(web, {"id": "x", "chat": "c", "text": "hi"}, secret=None).status_code == 401
        assert post(web, {"id": "x", "chat": "c", "text": "hi"}, secret="wrong").status_code == 403
        assert post(web, {"chat": "c"}).status_code == 400
        assert not InboundMessage.objects.exists()

        # A burst of three, one resent by the platform: three messages, one turn, one reply.
        peer.flood_next = 1  # the first send is answered 429 Retry-After: 1, as the platform does past its limit
        for number, text in enumerate(["hola", "quiero reservar", "para mañana"]):
            answered = post(web, {"id": f"m{number}", "chat": "c1", "from": "ana", "text": text})
            assert answered.status_code == 200 and answered.json() == {"ok": True, "duplicate": False, "refused": 0}
        assert post(web, {"id": "m1", "chat": "c1", "from": "ana", "text": "quiero reservar"}).json()["duplicate"]

        wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists(), timeout=30,
                   message="the reply delivered")
        assert InboundMessage.objects.count() == 3
        assert Turn.objects.count() == 1
        row = OutboundMessage.objects.get()
        assert row.chat_id == "c1"
        assert [reply["text"] for reply in peer.replies] == [row.text]
        assert all(word in row.text for word in ("hola", "quiero reservar", "para mañana"))
        assert len(peer.refused) == 1  # the 429, waited out: the send after it landed

        # Redaction, below every app, reached the platform through the setting alone: it
        # names the secret setting only (an unknown kind would have every string masked).
        script = ("from agentloop.core.redaction import channel_secrets, redact;"
                  "from conversations.models import Channel;"
                  "channel = Channel.objects.get(slug='echo1');"
                  f"print(channel_secrets(channel) == [{SECRET!r}], redact('key {SECRET}'))")
        shown = run_python([sys.executable, "manage.py", "shell", "--no-imports", "-c", script], env=processes.env(**EXTRA),
                           timeout=120)
        assert shown.stdout.split() == ["True", "key", "•••"], shown.stdout + shown.stderr
