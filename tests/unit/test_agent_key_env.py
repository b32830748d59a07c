"""An agent's `api_key_env` names the environment variable whose value is sent, as a
bearer token, to the URL the channel's operator chose: it may only name an API key
(…_API_KEY, or a name in AGENTLOOP_AGENT_KEY_ENVS), never SECRET_KEY or DATABASE_URL —
refused on save (model, admin, addchannel) and again when a turn runs."""

import asyncio

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from conversations.agents import AgentUnavailable, TurnContext
from conversations.models import Channel
from conversations.openai_agent import OpenAIAgent
from tests.fakes.openai_api import FakeOpenAI, Reply

pytestmark = pytest.mark.django_db
SECRETS = ["SECRET_KEY", "DATABASE_URL", "EMAIL_URL", "PATH", "openai_api_key", "X_API_KEY\n", ""]


@pytest.mark.parametrize("name", SECRETS)
def test_the_model_refuses_a_variable_that_is_not_an_api_key(make_channel, name):
    channel = Channel(slug="bot", agent="openai", agent_config={"model": "m", "api_key_env": name})
    with pytest.raises(ValidationError) as refused:
        channel.full_clean()
    assert "api_key_env" in " ".join(refused.value.message_dict["agent_config"])


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "GROQ_API_KEY", "MY_LLM_2_API_KEY"])
def test_api_key_variables_are_accepted(name):
    Channel(slug="bot", agent="openai", agent_config={"model": "m", "api_key_env": name}).full_clean()


def test_an_allowlisted_name_is_accepted(settings):
    settings.AGENTLOOP_AGENT_KEY_ENVS = ["OLLAMA_TOKEN"]
    Channel(slug="bot", agent="openai", agent_config={"model": "m", "api_key_env": "OLLAMA_TOKEN"}).full_clean()


def test_addchannel_refuses_it_with_a_clear_error():
    with pytest.raises(CommandError, match="api_key_env 'SECRET_KEY' is not allowed"):
        call_command("addchannel", "bot", "--agent", "openai", "--agent-model", "m", "--agent-key-env", "SECRET_KEY")
    assert not Channel.objects.exists()
    call_command("addchannel", "bot", "--agent", "openai", "--agent-model", "m", "--agent-key-env", "OPENAI_API_KEY")
    assert Channel.objects.get().agent_config["api_key_env"] == "OPENAI_API_KEY"


def test_the_admin_refuses_it_on_the_channel_form(client, make_channel):
    client.force_login(User.objects.create_superuser("olga", "olga@example.com", "pw-olga-1"))
    channel = make_channel("bot", agent="openai", agent_config={"model": "m"})
    url = reverse("admin:conversations_channel_change", args=[channel.pk])
    form = client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None}
    data.update({"agent_config": '{"model": "m", "api_key_env": "DATABASE_URL"}'})
    response = client.post(url, data)
    assert response.status_code == 200
    assert "api_key_env &#x27;DATABASE_URL&#x27; is not allowed" in response.content.decode()
    assert Channel.objects.get(pk=channel.pk).agent_config == {"model": "m"}


def test_a_stored_configuration_is_refused_at_run_time_and_nothing_is_sent(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "the-django-secret")
    with FakeOpenAI() as fake:
        fake.script(Reply("hola"))
        # Written before the check existed, or straight into the database.
        config = {"base_url": fake.url, "model": "m", "api_key_env": "SECRET_KEY"}
        ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="bot", text="hola", config=config)
        with pytest.raises(AgentUnavailable, match="api_key_env 'SECRET_KEY' is not allowed"):
            asyncio.run(OpenAIAgent().respond(ctx))
        assert fake.requests() == []
        monkeypatch.setenv("FAKE_API_KEY", "sk-allowed")
        ctx.config = {**config, "api_key_env": "FAKE_API_KEY"}
        assert asyncio.run(OpenAIAgent().respond(ctx)) == "hola"
        assert [r.api_key for r in fake.requests()] == ["sk-allowed"]
