"""The `a2a` agent (conversations/a2a_agent.py, docs/agents-and-tools.md#a2a-agents): a turn
sent to a remote Agent2Agent agent — here a real one built with the same SDK
(tests/fakes/a2a_agent.py) in a process of its own — through the real web server, worker
and the local Telegram Bot API; the reply goes through the ledger."""

import hashlib
import json
import sys

import httpx
import pytest

from conversations.models import Turn, TurnState
from conversations.models.turns import AgentSession
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import free_port, wait_until
from tests.end_to_end.test_ledger_e2e import delivered, texts
from tests.fakes.a2a_agent import ICS, REPORT
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
KEY = "desk-key-7Qm2vX9pL4"
KEY_ENV = {"DESK_API_KEY": KEY}


class Desk:
    """The fake A2A agent as a process of its own, and the log of what it received."""

    def __init__(self, processes, tmp_path, pace=0.3, options=()):
        self.log = tmp_path / "a2a.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "tests.fakes.a2a_agent", "--port", str(self.port), "--log", str(self.log),
                "--require-key", KEY, "--pace", str(pace), *options]
        self.proc = processes.start("a2a", args)

        def answers():
            assert self.proc.popen.poll() is None, self.proc.output()
            try:
                return httpx.get(f"{self.url}/.well-known/agent-card.json", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, timeout=20, message="the A2A desk")

    def lines(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def received(self):
        """The messages it was sent."""
        return [line for line in self.lines() if "text" in line]

    def cancelled(self):
        """The ids of the tasks it was asked to cancel (tasks/cancel)."""
        return [line["cancel"] for line in self.lines() if "cancel" in line]


def a2a_channel(make_channel, fake_telegram, desk, streaming=False, **config):
    return telegram_channel(make_channel, fake_telegram, agent="a2a", extra=UNPACED, streaming=streaming,
                            agent_config={"url": desk.url, "api_key_env": "DESK_API_KEY", **config})


def replies(fake, count):
    fake.wait_for("sendMessage", count=count, timeout=30)
    return texts(fake)


def test_an_a2a_agent_answers_through_the_ledger_in_one_context(processes, make_channel, fake_telegram, tmp_path):
    desk = Desk(processes, tmp_path)
    a2a_channel(make_channel, fake_telegram, desk)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "hola")
    assert replies(fake_telegram, 1) == ["Eco 1: hola"]
    send(web, "tg", 101, "sigo aquí")
    # The same contextId: the remote agent counts on, it sees one conversation.
    assert replies(fake_telegram, 2) == ["Eco 1: hola", "Eco 2: sigo aquí"]
    wait_until(delivered(2), message="both replies delivered by the ledger")
    first, second = desk.received()
    assert first["context_id"] and first["context_id"] == second["context_id"]
    turn = Turn.objects.order_by("pk").first()
    assert first["metadata"]["io.agentloop/conversation"] == turn.conversation_id
    assert first["metadata"]["io.agentloop/turn"] == turn.pk
    # Another person is another context.
    send(web, "tg", 202, "soy otra")
    wait_until(lambda: "Eco 1: soy otra" in texts(fake_telegram, 202), timeout=30, message="the other's reply")
    assert desk.received()[-1]["context_id"] != first["context_id"]


def test_a_streamed_answer_is_previewed_then_sent_by_the_ledger(processes, make_channel, fake_telegram, tmp_path):
    desk = Desk(processes, tmp_path, pace=0.4)
    a2a_channel(make_channel, fake_telegram, desk, streaming=True)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "despacio uno dos tres cuatro cinco seis siete")
    [final] = fake_telegram.wait_for("sendMessage", timeout=30)
    assert final.params["text"] == "uno dos tres cuatro cinco seis siete"
    drafts = [c.params["text"] for c in fake_telegram.calls("sendMessageDraft")]
    # Previews of the text so far, shorter than the final, before it (what was streamed).
    assert drafts and all(final.params["text"].startswith(d.rstrip("▍").rstrip()) for d in drafts)
    assert len(drafts[0].rstrip("▍").strip()) < len(final.params["text"])
    wait_until(delivered(1), message="the final delivered by the ledger")
    assert OutboundMessage.objects.get(state=OutboundState.DELIVERED).text == final.params["text"]
    assert Turn.objects.get().first_delta_at is not None


def test_stop_during_a_streamed_turn_cancels_the_remote_task(processes, make_channel, fake_telegram, tmp_path):
    """/stop cancels the turn; the remote agent, still working on its task, is sent
    tasks/cancel for it (else it would go on for nobody)."""
    desk = Desk(processes, tmp_path, pace=3)
    a2a_channel(make_channel, fake_telegram, desk, streaming=True)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "despacio uno dos tres cuatro cinco seis")
    fake_telegram.wait_for("sendMessageDraft", timeout=30)  # a word streamed: the task is the turn's
    send(web, "tg", 101, "/stop")
    [cancelled] = wait_until(desk.cancelled, timeout=20, message="tasks/cancel at the remote agent")
    [asked] = desk.received()
    assert cancelled == asked["task"] and asked["task"]
    wait_until(lambda: Turn.objects.get().state == TurnState.CANCELLED, message="the turn cancelled")
    assert "uno dos tres cuatro cinco seis" not in texts(fake_telegram)


def test_input_required_asks_the_person_and_the_next_turn_continues_the_task(
        processes, make_channel, fake_telegram, tmp_path):
    desk = Desk(processes, tmp_path)
    a2a_channel(make_channel, fake_telegram, desk)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "reserva una hora")
    assert replies(fake_telegram, 1) == ["¿Para qué día?"]
    waiting = AgentSession.objects.get()
    assert waiting.state["task_id"]
    send(web, "tg", 101, "el lunes")
    assert replies(fake_telegram, 2) == ["¿Para qué día?", "Reservado: el lunes."]
    [document] = fake_telegram.wait_for("sendDocument", timeout=30)
    assert document.params["document"]["filename"] == "cita.ics"
    assert document.params["document"]["sha256"] == hashlib.sha256(ICS).hexdigest()
    asked, answered = desk.received()
    assert answered["task_id"] == waiting.state["task_id"] and answered["context_id"] == asked["context_id"]
    # The task is over: the next message is a new one in the same context.
    wait_until(lambda: not AgentSession.objects.get().state.get("task_id"), message="the task closed")
    send(web, "tg", 101, "gracias")
    assert replies(fake_telegram, 3)[-1] == "Eco 3: gracias"
    assert desk.received()[-1]["task_id"] != waiting.state["task_id"]


def test_an_artifact_arrives_as_a_file(processes, make_channel, fake_telegram, tmp_path):
    desk = Desk(processes, tmp_path)
    a2a_channel(make_channel, fake_telegram, desk)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "informe")
    assert replies(fake_telegram, 1) == ["Aquí está el informe."]
    [document] = fake_telegram.wait_for("sendDocument", timeout=30)
    assert document.params["document"]["filename"] == "informe.txt"
    assert document.params["document"]["sha256"] == hashlib.sha256(REPORT).hexdigest()
    wait_until(delivered(1), message="the reply delivered by the ledger")
    row = OutboundMessage.objects.get(state=OutboundState.DELIVERED)
    text, files = row.chunks
    assert text == "Aquí está el informe." and [f["name"] for f in files["files"]] == ["informe.txt"], row.chunks


def test_a_remote_agent_that_never_answers_hits_the_deadline(processes, make_channel, fake_telegram, tmp_path):
    desk = Desk(processes, tmp_path)
    a2a_channel(make_channel, fake_telegram, desk, timeout=2)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "cuelga ya")
    [apology] = fake_telegram.wait_for("sendMessage", timeout=30)
    assert apology.params["text"].startswith("Sorry")
    turn = Turn.objects.get()
    assert turn.state == TurnState.FAILED
    assert turn.outcome == f"agent unavailable: the A2A agent at 127.0.0.1:{desk.port} did not answer within 2 s"


def test_a_refused_key_is_an_apology_and_the_key_is_never_written(processes, make_channel, fake_telegram, tmp_path):
    """The desk wants KEY; the worker holds another: the turn fails, redacted."""
    desk = Desk(processes, tmp_path)
    a2a_channel(make_channel, fake_telegram, desk)
    wrong = "wrong-key-Zx81KqP0aa"
    web, _ = processes.web(wait=False), processes.worker(DESK_API_KEY=wrong)
    send(web, "tg", 101, "hola")
    [apology] = fake_telegram.wait_for("sendMessage", timeout=30)
    assert apology.params["text"].startswith("Sorry")
    turn = Turn.objects.get()
    assert turn.state == TurnState.FAILED and "401" in turn.outcome, turn.outcome
    assert wrong not in turn.outcome and desk.received() == []
