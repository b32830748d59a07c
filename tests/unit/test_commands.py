"""The scripting commands: addchannel (create, update in place, refuse bad values) and
createagentkey (printed once, stored hashed)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent, EventKind
from conversations.models import AgentKey, Channel

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_addchannel_creates_then_updates_only_what_is_given():
    out = run("addchannel", "mybot", "--kind", "telegram", "--token", "1:A", "--mode", "webhook",
              "--api-base", "http://127.0.0.1:9/", "--strategy", "interrupt", "--window-closed", "0.8",
              "--max-wait", "9", "--max-messages", "4", "--greetings", "ahoy, que onda", "--no-typing")
    assert "created channel mybot" in out and "webhook secret:" in out
    channel = Channel.objects.get(slug="mybot")
    assert (channel.double_texting, channel.window_closed, channel.max_wait, channel.max_messages) == \
        ("interrupt", 0.8, 9.0, 4)
    assert channel.platform_settings["webhook_secret"] and channel.typing_mode == "never"
    assert channel.debounce_settings().greetings == frozenset({"ahoy", "que onda"})

    out = run("addchannel", "mybot", "--window-neutral", "3", "--mode", "polling")
    channel.refresh_from_db()
    assert "updated channel mybot" in out
    assert (channel.window_neutral, channel.window_closed, channel.platform_settings["mode"]) == (3.0, 0.8, "polling")
    assert Channel.objects.count() == 1


@pytest.mark.parametrize("args, message", [
    (["--max-messages", "0"], "max_messages"),
    (["--window-closed", "-1"], "window_closed"),
    (["--agent-config", "{nope"], "not JSON"),
    (["--api-base", "not a url"], "api_base"),
])
def test_addchannel_refuses_bad_values(args, message):
    with pytest.raises(CommandError, match=message):
        run("addchannel", "bad", "--kind", "api", *args)
    assert not Channel.objects.filter(slug="bad").exists()


def test_createagentkey_prints_the_key_once_and_stores_its_hash(make_channel):
    make_channel("shop")
    raw = run("createagentkey", "shop-agent", "--channel", "shop").strip()
    key = AgentKey.objects.get()
    assert raw.startswith("al_") and raw not in (key.key_hash, key.prefix)
    assert AgentKey.objects.for_key(raw) == key
    assert list(key.channels.values_list("slug", flat=True)) == ["shop"]
    # Audited as the admin's add form is (the same function issues both; issue 53).
    issued = AuditEvent.objects.get(kind=EventKind.AGENT_KEY_ISSUED)
    assert issued.actor.startswith("manage.py createagentkey") and issued.target == f"agent key {key.pk}"
    assert issued.extra["channels"] == ["shop"] and raw not in issued.summary + str(issued.extra)


def test_createagentkey_refuses_unknown_channels():
    with pytest.raises(CommandError, match="unknown channel"):
        run("createagentkey", "x", "--channel", "nope")
    assert not AgentKey.objects.exists()


def test_addchannel_sets_the_openai_agent():
    run("addchannel", "gpt", "--agent", "openai", "--agent-base-url", "http://127.0.0.1:11434/v1",
        "--agent-model", "llama3.1", "--agent-key-env", "OLLAMA_API_KEY", "--system-prompt", "Sé breve.")
    run("addchannel", "gpt", "--agent-config", '{"max_steps": 3}')
    channel = Channel.objects.get(slug="gpt")
    assert channel.agent == "openai"
    assert channel.agent_config == {"base_url": "http://127.0.0.1:11434/v1", "model": "llama3.1",
                                    "api_key_env": "OLLAMA_API_KEY", "system_prompt": "Sé breve.", "max_steps": 3}


def test_setwebhook_calls_telegram_with_the_secret(fake_telegram):
    Channel.objects.create(slug="mybot", kind="telegram", platform_settings={
        "bot_token": "77:HOOK", "api_base": fake_telegram.url})
    out = run("setwebhook", "mybot", "--url", "https://bot.example.com")
    channel = Channel.objects.get(slug="mybot")
    hook = fake_telegram.webhook("77:HOOK")
    assert hook["url"] == "https://bot.example.com/webhooks/telegram/mybot/"
    secret = channel.platform_settings["webhook_secret"]
    assert hook["secret_token"] == secret and secret
    assert channel.platform_settings["mode"] == "webhook" and "webhook set" in out
    run("setwebhook", "mybot", "--delete")
    assert fake_telegram.webhook("77:HOOK") is None
    assert Channel.objects.get(slug="mybot").platform_settings["mode"] == "polling"


def test_setwebhook_refuses_what_cannot_work(fake_telegram):
    Channel.objects.create(slug="shop", kind="api")
    with pytest.raises(CommandError, match="no Telegram channel"):
        run("setwebhook", "shop", "--url", "https://x.example")
    Channel.objects.create(slug="tg", kind="telegram", platform_settings={
        "bot_token": "1:BAD", "api_base": fake_telegram.url})
    fake_telegram.fail_next("setWebhook", status=400, description="Bad Request: bad webhook: HTTPS url must be provided")
    with pytest.raises(CommandError, match="Telegram refused"):
        run("setwebhook", "tg", "--url", "https://x.example")
