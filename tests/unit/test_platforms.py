"""Platforms as adapters (conversations.platforms): the registry, the settings a
platform checks on save, the channel block the ledger reads, and the migration that
moved the platform columns into Channel.platform_settings."""

import asyncio
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from audit.models import AuditEvent, EventKind
from conversations import platforms
from conversations.models import Channel
from conversations.platforms.api.transport import ApiCallbackTransport, StoredTransport
from conversations.platforms.telegram.transport import TelegramTransport, close_bots
from conversations.platforms.webchat.transport import WebchatTransport
from delivery import ledger, transports
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
from delivery.transports import SendResult, Target
from tests.support.e2e import UNPACED
from tests.support.fresh_database import fresh_database, latest, migrate, rows_at

pytestmark = pytest.mark.django_db


def test_the_registry_names_every_platform_and_picks_each_transport(make_channel):
    assert {"api", "webchat", "telegram"} <= {kind for kind, _ in platforms.choices()}
    assert isinstance(transports.transport_for(make_channel("a")), StoredTransport)
    hooked = make_channel("b", platform_settings={"callback_url": "https://x.example/r", "callback_secret": "s" * 12})
    assert isinstance(transports.transport_for(hooked), ApiCallbackTransport)
    assert isinstance(transports.transport_for(make_channel("w", kind="webchat")), WebchatTransport)
    assert isinstance(transports.transport_for(make_channel("t", kind="telegram")), TelegramTransport)
    assert {"telegram", "webchat"} <= set(platforms.typing_kinds()) and "api" not in platforms.typing_kinds()
    assert sorted(type(kept).__module__ for kept in platforms.connections()) == [
        "conversations.platforms.discord.gateway", "conversations.platforms.email.mailbox",
        "conversations.platforms.matrix.sync",
        "conversations.platforms.telegram.polling"]
    with pytest.raises(platforms.UnknownPlatform):
        platforms.get("carrier-pigeon")


def test_settings_are_checked_on_save_with_defaults_filled(make_channel):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:A"})
    assert channel.platform_settings == {"bot_token": "1:A", "webhook_secret": "", "mode": "webhook", "bot_username": "",
                                         "api_base": "https://api.telegram.org", "messages_per_second": 29.0,
                                         "chat_interval": 1.0, "group_messages_per_minute": 20.0}
    for wrong in ({"bot_tokn": "1:A"}, {"mode": "carrier"}, {"api_base": "not a url"},
                  {"messages_per_second": "fast"}, {"chat_interval": -1}):
        with pytest.raises(ValidationError):
            Channel(slug="bad", kind="telegram", platform_settings=wrong).save()
    assert not Channel.objects.filter(slug="bad").exists()


def test_a_channel_that_cannot_send_says_why_and_saving_it_right_lets_its_replies_go(make_channel):
    channel = make_channel("tg", kind="telegram")
    assert channel.send_blocked == "no bot_token set"
    channel.platform_settings["bot_token"] = "1:A"
    channel.save()
    assert Channel.objects.get(pk=channel.pk).send_blocked == ""


@pytest.mark.django_db(transaction=True)
def test_a_refused_bot_token_blocks_the_channel_and_burns_no_attempt(make_channel, make_conversation,
                                                                     fake_telegram):
    """Telegram answers 401 to a revoked token: the row waits as it was, the channel's
    replies wait (audited once), and saving the channel with a new token lets them go."""
    fake_telegram.require_known_tokens = True
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "9:REVOKED",
                                                                     "api_base": fake_telegram.url, **UNPACED})
    conversation = make_conversation(channel, "301")
    rows = [ledger.enqueue(conversation, text, kind=OutboundKind.REPLY) for text in ("uno", "dos")]
    claimed = ledger.claim_due("w1")
    assert len(claimed) == 2

    async def send_all():
        try:
            return [await ledger.send(row) for row in claimed]
        finally:
            await close_bots()

    results = asyncio.run(send_all())
    assert {r.outcome for r in results} == {Outcome.CHANNEL_BLOCKED}
    assert "9:REVOKED" not in results[0].error  # redacted: the token is the channel's secret
    for row, result in zip(claimed, results):
        ledger.finish(row, "w1", result)
    for row in rows:
        waiting = OutboundMessage.objects.get(pk=row.pk)
        assert (waiting.state, waiting.attempts, waiting.last_outcome) == \
            (OutboundState.PENDING, 0, Outcome.CHANNEL_BLOCKED)
    channel.refresh_from_db()
    assert "refused" in channel.send_blocked and "9:REVOKED" not in channel.send_blocked
    assert AuditEvent.objects.filter(kind=EventKind.CHANNEL_BLOCKED).count() == 1
    assert ledger.claim_due("w1") == []

    fake_telegram.add_token("9:FRESH")
    channel.platform_settings["bot_token"] = "9:FRESH"
    channel.save()
    again = ledger.claim_due("w1")
    assert [r.pk for r in again] == [r.pk for r in rows] and not any(r.needs_marker for r in again)


def test_finish_with_a_blocked_channel_keeps_a_resent_row_labelled(make_channel, make_conversation):
    """A row that may have gone out before stays labelled when the block gives it back."""
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:A", **UNPACED})
    row = ledger.enqueue(make_conversation(channel, "1"), "hola", kind=OutboundKind.REPLY)
    [first] = ledger.claim_due("w1")
    ledger.finish(first, "w1", SendResult.failed(Outcome.AMBIGUOUS, "timed out"))
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=None)
    [second] = ledger.claim_due("w1", boot=True)
    assert second.needs_marker
    ledger.finish(second, "w1", SendResult.failed(Outcome.CHANNEL_BLOCKED, "Unauthorized"))
    channel.refresh_from_db()
    channel.save()  # an operator fixes it
    [third] = ledger.claim_due("w1")
    assert third.needs_marker and third.attempts == 2


def test_redaction_asks_the_platform_for_its_secrets(make_channel):
    from agentloop.core.redaction import channel_secrets

    channel = make_channel("shop", platform_settings={
        "callback_url": "https://shop.example/replies?key=K3yK3yK3yK3y99", "callback_secret": "cb-secret-123"})
    assert {"cb-secret-123", "K3yK3yK3yK3y99"} <= set(channel_secrets(channel))
    row = Channel.objects.filter(pk=channel.pk).values("kind", "platform_settings", "agent_config").get()
    assert set(channel_secrets(row)) == set(channel_secrets(channel))


def test_addchannel_takes_each_platforms_flags_and_refuses_another_platforms():
    out = StringIO()
    call_command("addchannel", "hook", "--callback-url", "https://x.example/r", "--callback-secret", "s3cr3t-s3cr3t",
                 stdout=out)
    assert Channel.objects.get(slug="hook").platform_settings["callback_secret"] == "s3cr3t-s3cr3t"
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--token is not a setting of API channels"):
        call_command("addchannel", "hook", "--token", "1:A", stdout=out)


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_the_platform_columns_both_ways(tmp_path):
    """On an empty database of its own: migrated to just before the move, the move alone
    forwards and backwards, read through its own migration's models, then forward to the
    leaves (every later migration of every app applied over the moved-back columns)."""
    moving = ("conversations", "0008_platform_settings")
    before = [("conversations", "0007_message_edits")]
    expected = {
        "tg": ({"bot_token": "1:A", "webhook_secret": "w" * 20, "api_base": "http://127.0.0.1:9", "mode": "polling"}, ""),
        "nobot": ({"api_base": "https://api.telegram.org", "mode": "webhook"}, "no bot_token set"),
        "shop": ({"callback_url": "https://x.example/r", "callback_secret": "c" * 12}, ""),
        "web": ({}, ""),
    }
    with fresh_database(tmp_path) as alias:
        migrate(alias, before)
        old = rows_at(alias, before, "conversations.Channel")
        old.create(slug="tg", kind="telegram", bot_token="1:A", webhook_secret="w" * 20,
                   api_base="http://127.0.0.1:9", telegram_mode="polling")
        old.create(slug="nobot", kind="telegram")
        old.create(slug="shop", kind="api", callback_url="https://x.example/r", callback_secret="c" * 12)
        old.create(slug="web", kind="webchat")
        migrate(alias, [moving])
        moved = rows_at(alias, [moving], "conversations.Channel")
        assert {c.slug: (c.platform_settings, c.send_blocked) for c in moved} == expected
        migrate(alias, before)
        back = {c.slug: (c.bot_token, c.telegram_mode, c.callback_secret)
                for c in rows_at(alias, before, "conversations.Channel")}
        assert back["tg"] == ("1:A", "polling", "") and back["shop"] == ("", "webhook", "c" * 12)
        migrate(alias, latest(alias))
        # Moved again from the columns it was moved back to, and as every later migration left it.
        assert {c.slug: (c.platform_settings, c.send_blocked) for c in Channel.objects.using(alias)} == expected
        assert not Channel.objects.exists()  # the test database untouched


def test_the_telegram_bootstrap_hook_adds_a_polling_channel_from_the_environment(monkeypatch):
    from conversations.platforms.telegram import TelegramPlatform

    platform = TelegramPlatform()
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    assert platform.bootstrap(None) == ""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:ABC")
    line = platform.bootstrap(None)
    assert "polling" in line and platform.bootstrap(None) == line
    channel = Channel.objects.get(slug="telegram")
    assert (channel.kind, channel.agent, channel.send_blocked) == ("telegram", "demo", "")
    assert channel.platform_settings["mode"] == "polling" and channel.platform_settings["bot_token"] == "123:ABC"
    assert channel.pk in platform.connection().channel_ids()


def test_a_sent_answer_without_a_message_id_is_ambiguous_and_a_threaded_reply_keeps_its_fields(
        make_channel, make_conversation, fake_telegram):
    """Replies read only the sent message's id from Telegram's answer (ReplyBot): an
    answer without one (the request went out) is ambiguous, to be resent labelled; a
    reply to a message in a topic still carries its reply and thread parameters."""
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "9:OK",
                                                                     "api_base": fake_telegram.url})
    transport = transports.transport_for(channel)

    async def send(target):
        try:
            return await transport.send_text(target, "hola")
        finally:
            await close_bots()

    sent = asyncio.run(send(Target(chat_id="301", reply_target="77", thread_id="5")))
    call = fake_telegram.calls("sendMessage")[-1]
    assert sent.ok and sent.platform_message_id == str(fake_telegram.sent_messages("9:OK")[-1]["message_id"])
    assert call.params["message_thread_id"] in (5, "5") and call.params["reply_parameters"] == {
        "message_id": 77, "allow_sending_without_reply": True}

    fake_telegram.set_handler("sendMessage", lambda token, params: {"chat": {"id": 301}})
    unreadable = asyncio.run(send(Target(chat_id="301")))
    assert unreadable.outcome == Outcome.AMBIGUOUS and unreadable.error == "unreadable answer: KeyError"
