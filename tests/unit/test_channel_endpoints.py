"""A channel's credentials go only where they were given for: changing a channel's
`api_base` asks for its token again (the admin, `addchannel`), a Bot API answering with a
redirect is not followed (the token in the URL would go to the redirect's host), and an
agent's `secret` is masked in the admin without being lost on save."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import reverse

from conversations.models import Channel
from conversations.platforms.telegram.transport import close_bots
from delivery.models import Outcome
from delivery.transports import Target
from tests.unit.test_admin import NO_RULES

pytestmark = pytest.mark.django_db

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
AGENT_SECRET = "agent-config-secret-7781"


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("operator", "op@example.com", "pw-operator-1"))
    return client


@pytest.fixture
def bot(make_channel):
    return make_channel("tg", kind="telegram", platform_settings={"bot_token": TOKEN, "api_base": "https://api.telegram.org"},
                        agent="webhook", agent_config={"url": "https://agent.example.com/turn", "secret": AGENT_SECRET,
                                                       "timeout": 20})


def change_page(operator, channel):
    url = reverse("admin:conversations_channel_change", args=[channel.pk])
    page = operator.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None} | NO_RULES
    data["agent_config"] = form["agent_config"].value()  # the textarea's text, as the browser posts it
    if not isinstance(data["agent_config"], str):
        data["agent_config"] = json.dumps(data["agent_config"])
    return url, page.content.decode(), data


def test_a_new_api_base_in_the_admin_asks_for_the_token_again(operator, bot):
    url, _, data = change_page(operator, bot)
    moved = {**data, "telegram_api_base": "https://bots.example.net", "telegram_bot_token": ""}
    response = operator.post(url, moved)
    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert "enter the bot token again" in str(errors["telegram_bot_token"]).lower()
    bot.refresh_from_db()
    assert bot.platform_settings["api_base"] == "https://api.telegram.org"

    response = operator.post(url, {**moved, "telegram_bot_token": TOKEN})  # given again: the operator means it
    assert response.status_code == 302, response.context["adminform"].form.errors
    bot.refresh_from_db()
    assert (bot.platform_settings["api_base"], bot.platform_settings["bot_token"]) == ("https://bots.example.net", TOKEN)
    # Other edits keep the stored token as before.
    response = operator.post(url, {**change_page(operator, bot)[2], "window_closed": "0.9", "telegram_bot_token": ""})
    assert response.status_code == 302, response.context["adminform"].form.errors
    bot.refresh_from_db()
    assert bot.platform_settings["bot_token"] == TOKEN and bot.window_closed == 0.9


def test_addchannel_refuses_a_new_api_base_without_the_token(bot):
    with pytest.raises(CommandError, match="--token"):
        call_command("addchannel", "tg", "--api-base", "https://bots.example.net", stdout=StringIO())
    bot.refresh_from_db()
    assert bot.platform_settings["api_base"] == "https://api.telegram.org"
    call_command("addchannel", "tg", "--api-base", "https://bots.example.net", "--token", TOKEN, stdout=StringIO())
    bot.refresh_from_db()
    assert bot.platform_settings["api_base"] == "https://bots.example.net"
    call_command("addchannel", "tg", "--name", "Bot", stdout=StringIO())  # nothing moved: nothing asked


def test_an_agents_secret_is_masked_in_the_admin_and_kept_on_save(operator, bot):
    url, html, data = change_page(operator, bot)
    assert AGENT_SECRET not in html and "agent.example.com" in html
    response = operator.post(url, {**data, "window_closed": "0.8"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    bot.refresh_from_db()
    assert bot.agent_config == {"url": "https://agent.example.com/turn", "secret": AGENT_SECRET, "timeout": 20}
    assert bot.window_closed == 0.8

    changed = json.loads(data["agent_config"]) | {"secret": "a-new-secret-0042"}
    response = operator.post(url, {**data, "agent_config": json.dumps(changed)})
    assert response.status_code == 302, response.context["adminform"].form.errors
    bot.refresh_from_db()
    assert bot.agent_config["secret"] == "a-new-secret-0042"


class Redirecting:
    """A Bot API root that answers every request with a redirect to another server, which
    records what reaches it."""

    def __init__(self):
        self.reached = []
        catcher = self

        class Catch(BaseHTTPRequestHandler):
            def do_POST(self):
                catcher.reached.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                body = b'{"ok": true, "result": {"message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"}}}'
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self):
                self.send_response(307)
                self.send_header("Location", f"http://127.0.0.1:{catcher.catch.server_address[1]}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.catch = ThreadingHTTPServer(("127.0.0.1", 0), Catch)
        self.redirect = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        self.url = f"http://127.0.0.1:{self.redirect.server_address[1]}"
        for server in (self.catch, self.redirect):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self):
        for server in (self.catch, self.redirect):
            server.shutdown()
            server.server_close()


def test_a_redirect_from_the_bot_api_is_not_followed(make_channel):
    redirecting = Redirecting()
    channel = make_channel("moved", kind="telegram", platform_settings={"bot_token": TOKEN, "api_base": redirecting.url})

    async def send():
        try:
            return await channel.platform.transport(channel).send_text(Target(chat_id="1"), "hola")
        finally:
            await close_bots()

    try:
        result = asyncio.run(send())
    finally:
        redirecting.close()
    assert redirecting.reached == []  # the token never went to the redirect's host
    assert result.outcome == Outcome.CHANNEL_BLOCKED, result
    assert "redirect" in result.error and "api_base" in result.error and TOKEN not in result.error
    assert Channel.objects.get(pk=channel.pk).platform_settings["bot_token"] == TOKEN
