"""Deletions (issue 56 §1): a message the person deleted on their side leaves its open
buffer (no turn at all if it was the only one), makes a turn without an effect run again
without it (interrupt), or becomes a note for the agent's next turn — its text kept out
of the prompt. Time is injected where windows matter; the end-to-end tests run the real
web server and worker against the fake Slack Web API and the fake OpenAI server."""

import json
import time

import pytest

from audit.models import AuditEvent, EventKind
from conversations import deletions, flushing, turns
from conversations.deletions import Deletion
from conversations.ingest import admit
from conversations.models import BufferState, ContextNote, InboundMessage, MessageBuffer, Turn, TurnState
from tests.conftest import wait_until
from tests.end_to_end.test_edits import at, msg, running_turn, set_strategy
from tests.end_to_end.test_slack_e2e import started_worker
from tests.fakes import slack_api
from tests.fakes.slack_api import FakeSlackAPI
from tests.support.slack import TOKEN, deliver, send, slack_channel


def deletion(mid, seconds=1.0, chat="100"):
    return Deletion(platform_message_id=str(mid), deleted_at=at(seconds), source="api", chat_id=chat, sender_id=chat)


@pytest.fixture
def channel(make_channel):
    return make_channel("chan")


# --- in the open buffer ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_only_message_deleted_in_its_window_means_no_turn(channel):
    admit(channel, msg(1, "cancela mi hora de las 10"), now=at(0))
    result = deletions.apply(channel, deletion(1), now=at(1))
    assert (result.outcome, result.duplicate) == (deletions.NO_TURN, False)
    assert MessageBuffer.objects.get().state == BufferState.DROPPED
    assert flushing.flush_due(now=at(60)) == [] and not Turn.objects.exists()
    message = InboundMessage.objects.get()
    assert message.deleted_at == at(1) and message.buffer_id is None
    event = AuditEvent.objects.get(kind=EventKind.MESSAGE_DELETED)
    assert (event.target, event.extra["outcome"]) == (f"message {message.pk}", "no_turn")


@pytest.mark.django_db
def test_a_deleted_message_leaves_the_burst_and_the_rest_runs(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    admit(channel, msg(2, "cancela mi hora de las 10"), now=at(1))
    admit(channel, msg(3, "y agéndame la de kine y"), now=at(2))
    result = deletions.apply(channel, deletion(2), now=at(3))
    assert result.outcome == deletions.WITHDRAWN and MessageBuffer.objects.get().message_count == 2
    [turn] = flushing.flush_due(now=at(60))
    assert turn.merged_input == "hola\ny agéndame la de kine y"


@pytest.mark.django_db
def test_a_redelivered_deletion_changes_nothing_and_an_unknown_one_is_audited(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    admit(channel, msg(2, "cancela"), now=at(1))
    assert deletions.apply(channel, deletion(2), now=at(2)).outcome == deletions.WITHDRAWN
    again = deletions.apply(channel, deletion(2), now=at(3))
    assert again.duplicate and MessageBuffer.objects.get().message_count == 1
    assert deletions.apply(channel, deletion(9), now=at(3)).outcome == deletions.UNKNOWN
    # Someone else's message is an unknown one to them.
    assert deletions.apply(channel, deletion(1, chat="200"), now=at(3)).outcome == deletions.UNKNOWN
    assert InboundMessage.objects.get(platform_message_id="1").deleted_at is None
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_DELETED).count() == 3


# --- in a turn -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_interrupt_without_an_effect_reruns_the_turn_without_the_deleted_message(channel):
    set_strategy(channel, "interrupt")
    admit(channel, msg(1, "Agéndame psicología el martes."), now=at(0))
    admit(channel, msg(2, "Y cancela la de las 10."), now=at(0.5))
    [turn] = flushing.flush_due(now=at(5))
    assert turns.start(turn.pk, "w1", now=at(5))
    result = deletions.apply(channel, deletion(2), now=at(6))
    assert (result.outcome, result.turn_id) == (deletions.RERUN, turn.pk)
    assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED
    [rerun] = flushing.flush_due(now=at(6))
    assert rerun.merged_input == "Agéndame psicología el martes."
    assert not ContextNote.objects.exists()


@pytest.mark.django_db
def test_the_only_message_of_a_turn_without_an_effect_deleted_cancels_it(channel):
    set_strategy(channel, "interrupt")
    turn = running_turn(channel, "cancela mi hora de las 10.")
    result = deletions.apply(channel, deletion(1), now=at(3))
    assert result.outcome == deletions.CANCELLED
    assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED
    assert flushing.flush_due(now=at(60)) == [] and Turn.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("strategy,effect", [("interrupt", True), ("enqueue", False)])
def test_too_late_the_agent_is_told_and_the_text_leaves_its_history(channel, strategy, effect):
    set_strategy(channel, strategy)
    turn = running_turn(channel, "cancela mi hora de las 10.", effect=effect)
    result = deletions.apply(channel, deletion(1), now=at(3))
    assert (result.outcome, result.turn_id) == (deletions.NOTED, turn.pk)
    assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
    [note] = ContextNote.objects.all()
    assert "deleted" in note.text and "cancela" not in note.text
    assert Turn.objects.get(pk=turn.pk).merged_input == deletions.WITHDRAWN_TEXT


# --- the inbound API ------------------------------------------------------------------------------


URL = "/api/v1/channels/shop/messages/{}"


@pytest.fixture
def shop(make_channel):
    return make_channel("shop", kind="api", double_texting="interrupt")


def post_message(client, key, message_id, text):
    response = client.post("/api/v1/channels/shop/messages", data={"message_id": message_id, "contact": "ana",
                                                                     "text": text},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 202, response.content


@pytest.mark.django_db
def test_api_delete_inside_the_window_means_no_turn_and_a_retry_is_a_duplicate(client, shop, agent_key):
    key = agent_key(shop)
    post_message(client, key, "m1", "cancela mi hora de las 10")
    response = client.delete(URL.format("m1"), HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["outcome"], data["duplicate"]) == ("no_turn", False)
    again = client.delete(URL.format("m1"), HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert again["duplicate"] is True
    assert flushing.flush_due(now=at(10**6)) == [] and not Turn.objects.exists()


@pytest.mark.django_db
def test_api_delete_errors_and_schema(client, shop, make_channel, agent_key):
    key = agent_key(shop)
    other_key = agent_key(make_channel("other", kind="api"))
    post_message(client, key, "m1", "hola")
    for headers, message_id, statuses in [({}, "m1", (401, 403)), ({"HTTP_AUTHORIZATION": f"Bearer {other_key}"},
                                                                    "m1", (403,)),
                                          ({"HTTP_AUTHORIZATION": f"Bearer {key}"}, "m9", (404,))]:
        response = client.delete(URL.format(message_id), **headers)
        assert response.status_code in statuses and "error" in response.json()
    assert InboundMessage.objects.get().deleted_at is None
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/channels/{slug}/messages/{message_id}"]["delete"]
    assert {"200", "404"} <= set(operation["responses"]) and "re-run without it" in operation["description"]


# --- the playground (its websocket) and the story page ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_playground_deletes_the_persons_own_message_only():
    from conversations.models import Channel
    from tests.unit.test_console_websockets import OPERATE, make_user, receive_until, talk

    Channel.objects.create(slug="playground", kind="webchat", agent="demo", window_closed=30.0)
    owner, other = make_user("op", perms=OPERATE), make_user("op2", perms=OPERATE)

    async def send(comm, hello):
        await comm.send_json_to({"text": "cancela mi hora de las 10", "id": "a1"})
        await receive_until(comm, lambda m: m["type"] == "admitted")
    talk("/ws/console/playground/playground/", owner, send)

    async def someone_else(comm, hello):
        await comm.send_json_to({"delete": "a1"})
        assert (await receive_until(comm, lambda m: m["type"] == "deleted"))["outcome"] == "unknown_message"
    talk("/ws/console/playground/playground/", other, someone_else)

    async def delete(comm, hello):
        await comm.send_json_to({"delete": "a1"})
        deleted = await receive_until(comm, lambda m: m["type"] == "deleted")
        assert (deleted["id"], deleted["outcome"], deleted["duplicate"]) == ("a1", "no_turn", False)
    talk("/ws/console/playground/playground/", owner, delete)

    async def reconnect(comm, hello):
        [mine] = hello["transcript"]
        assert (mine["id"], mine["deleted"]) == ("console:a1", True)
    talk("/ws/console/playground/playground/", owner, reconnect)
    assert MessageBuffer.objects.get().state == BufferState.DROPPED


@pytest.mark.django_db
def test_the_story_page_shows_the_message_deleted(channel):
    from agentloop.console import story

    admit(channel, msg(1, "cancela mi hora de las 10"), now=at(0))
    deletions.apply(channel, deletion(1), now=at(1))
    page = story.page(InboundMessage.objects.get().conversation_id)
    [entry] = [e for e in page.entries if e.kind == "message"]
    assert entry.title.endswith("(deleted)") and any(label == "Deleted" for label, _ in entry.details)


# --- end to end: Slack's message_deleted, the real web server and worker ---------------------------


@pytest.fixture
def fake_slack():
    with FakeSlackAPI(tokens=[TOKEN]) as fake:
        yield fake


@pytest.mark.e2e
def test_slack_deletion_inside_the_window_means_no_turn(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack, window_closed=2.0, window_open=2.0, window_neutral=2.0)
    web, _ = processes.web(), started_worker(processes)
    event = send(web, "cancela mi hora de las 10.")
    answer = deliver(web, slack_api.envelope(slack_api.deleted_event(event)))
    assert (answer["deletion"], answer["duplicate"]) == ("no_turn", False)
    assert deliver(web, slack_api.envelope(slack_api.deleted_event(event)))["duplicate"] is True
    # A message sent after the deleted one's window would have closed is answered alone.
    time.sleep(2.5)
    send(web, "¿qué horas tengo?")
    [reply] = fake_slack.wait_for("chat.postMessage", timeout=20)
    assert reply.body["text"] == "¿qué horas tengo?"  # the echo agent: the deleted text never ran
    assert Turn.objects.count() == 1


@pytest.mark.e2e
def test_slack_deletion_during_a_turn_without_effect_reruns_it_without_the_message(processes, make_channel,
                                                                                      fake_slack):
    slack_channel(make_channel, fake_slack, double_texting="interrupt", window_closed=1.0, window_neutral=1.0,
                  agent_config={"delay": 3.0})
    web, _ = processes.web(), started_worker(processes)
    send(web, "Agéndame psicología el martes,")
    second = send(web, "y cancela la de las 10")
    first = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).first(), timeout=20,
                       message="turn running")
    assert "cancela" in first.merged_input
    answer = deliver(web, slack_api.envelope(slack_api.deleted_event(second)))
    assert answer["deletion"] == "rerun"
    [reply] = fake_slack.wait_for("chat.postMessage", timeout=20)
    assert reply.body["text"] == "Agéndame psicología el martes,"
    first.refresh_from_db()
    assert first.state == TurnState.CANCELLED
    wait_until(lambda: Turn.objects.filter(state=TurnState.DONE).count() == 1, message="re-run done")
    assert len(fake_slack.calls("chat.postMessage")) == 1


@pytest.mark.e2e
def test_slack_deletion_after_an_effect_is_told_to_the_agent_without_the_text(processes, make_channel, fake_slack):
    from tests.end_to_end.test_openai_agent_e2e import KEY_ENV, PSICO
    from tests.fakes.openai_api import FakeOpenAI, Reply, ToolCalls
    from tools.models import CalendarEvent

    with FakeOpenAI() as fake_openai:
        slack_channel(make_channel, fake_slack, agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        fake_openai.script(ToolCalls([("calendar_create_event", PSICO[0])]), Reply("Listo, agendada."),
                           Reply("De acuerdo."))
        web, _ = processes.web(), started_worker(processes, **KEY_ENV)
        event = send(web, "Agéndame psicología el martes a las 10.")
        fake_slack.wait_for("chat.postMessage", timeout=20)
        assert deliver(web, slack_api.envelope(slack_api.deleted_event(event)))["deletion"] == "noted"
        send(web, "Gracias.")
        fake_slack.wait_for("chat.postMessage", count=2, timeout=20)
        requests = fake_openai.requests()
    assert CalendarEvent.objects.count() == 1
    prompt = requests[2].messages
    said = json.dumps(prompt, ensure_ascii=False)
    assert "Agéndame psicología" not in said
    notes = [m["content"] for m in prompt if m["role"] == "system" and "deleted" in m["content"]]
    assert notes and "calendar_create_event" in notes[0]
    assert prompt[-1] == {"role": "user", "content": "Gracias."}
