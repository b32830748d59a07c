"""The `a2a` agent's bounds, run in this process against the real A2A desk
(tests/fakes/a2a_agent.py, its own process): the key goes only where the operator sent
it, an answer is read capped, a /reset starts another context."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from conversations import agent_sessions
from conversations.a2a_agent import A2AAgent
from conversations.agents import AgentUnavailable, TurnContext
from tests.end_to_end.test_a2a_agent import KEY, Desk


def on_a_thread(fn):
    """`fn` on asgiref's thread, as the worker's database threads run it; that thread's
    connection closed after each call (PostgreSQL drops no test database someone is in)."""
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(run)


def context(conversation, config, text="hola", turn_id=1):
    return TurnContext(turn_id=turn_id, conversation_id=conversation.pk, channel_slug=conversation.channel.slug,
                       text=text, config=config,
                       load_session=on_a_thread(lambda key: agent_sessions.load(conversation.pk, key)),
                       save_session=on_a_thread(lambda key, state, new: agent_sessions.save(
                           conversation.pk, key, state, new=new)))


def answer(conversation, config, text="hola"):
    return asyncio.run(A2AAgent().respond(context(conversation, config, text)))


@pytest.fixture
def conversation(make_channel, make_conversation, transactional_db):
    return make_conversation(make_channel("a2a", agent="a2a"))


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("DESK_API_KEY", KEY)


def test_a_variable_that_is_not_an_api_key_is_never_read(conversation, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "not-for-agents")
    with pytest.raises(AgentUnavailable, match="api_key_env 'SECRET_KEY' is not allowed"):
        answer(conversation, {"url": "http://127.0.0.1:9", "api_key_env": "SECRET_KEY"})


def test_a_card_naming_another_host_is_not_sent_the_key(processes, tmp_path, conversation, keyed):
    desk = Desk(processes, tmp_path, options=["--interface-url", "http://localhost:1/"])
    with pytest.raises(AgentUnavailable, match="names no interface at 127.0.0.1"):
        answer(conversation, {"url": desk.url, "api_key_env": "DESK_API_KEY"})
    assert desk.received() == []


def test_an_answer_over_the_limit_is_not_read(processes, tmp_path, conversation, keyed, settings):
    desk = Desk(processes, tmp_path)
    settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES = 100  # the card alone is larger
    with pytest.raises(AgentUnavailable, match="answered more than 100 bytes"):
        answer(conversation, {"url": desk.url, "api_key_env": "DESK_API_KEY"})


def test_a_reset_starts_another_context(processes, tmp_path, conversation, keyed):
    desk = Desk(processes, tmp_path)
    config = {"url": desk.url, "api_key_env": "DESK_API_KEY"}
    assert answer(conversation, config, "uno").text == "Eco 1: uno"
    assert answer(conversation, config, "dos").text == "Eco 2: dos"
    conversation.context_reset_at = timezone.now()
    conversation.save(update_fields=["context_reset_at"])
    assert answer(conversation, config, "tres").text == "Eco 1: tres"
    assert answer(conversation, config, "cuatro").text == "Eco 2: cuatro"
    contexts = [line["context_id"] for line in desk.received()]
    assert contexts[0] == contexts[1] != contexts[2] == contexts[3]
