"""A chat's platform address (conversations.addresses; the optional Inbound.address of the
platform contract), with Teams' conversation reference as the platform that gives one:
stored once per chat and again only when it changes, read by the transport so a reply
goes to the serviceUrl of the chat's last activity (the fake Connector serves its root,
the channel's setting, and regions under it), the setting and the Connector's "create
conversation" only for a chat no activity came from; the Connector's images fetched from
a stored serviceUrl's host; erased with the person, swept with the chat's messages."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations import addresses, erasure, retention
from conversations.models import InboundMessage, PlatformAddress
from conversations.platforms.teams import verify
from conversations.platforms.teams.transport import TeamsTransport
from delivery.transports import Target
from tests.fakes import teams_api as teams
from tests.fakes.teams_api import GROUP_CHAT, PERSONAL, FakeTeams
from tests.support.teams import run, teams_channel

URL = "/webhooks/teams/teams/"


@pytest.fixture
def fake_teams():
    verify.forget()
    with FakeTeams() as fake:
        yield fake
    verify.forget()


@pytest.fixture
def bot(make_channel, fake_teams):
    return teams_channel(make_channel, fake_teams)


def post(client, fake, activity):
    """The activity as the Connector POSTs it from its serviceUrl (the token claims it)."""
    token = fake.connector_token(service_url=activity["serviceUrl"])
    response = client.post(URL, data=json.dumps(activity).encode(), content_type="application/json",
                           headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content



def send(channel, text="hola", chat_id=teams.USER):
    result = run(TeamsTransport(channel).send_text(Target(chat_id), text))
    assert result.ok, result.error
    return result


def test_a_chats_reference_is_stored_once_and_again_when_its_service_url_changes(client, bot, fake_teams):
    amer, emea = fake_teams.region_url("amer"), fake_teams.region_url("emea")
    post(client, fake_teams, teams.message_activity("hola", service_url=amer))
    row = PlatformAddress.objects.get()
    assert (row.channel_id, row.chat_id) == (bot.pk, teams.USER)  # the person's id: the chat id stays short
    assert row.address == {"serviceUrl": amer, "conversationId": PERSONAL, "tenantId": teams.TENANT}
    first_written = row.updated_at
    post(client, fake_teams, teams.message_activity("¿sigues?", service_url=amer))
    row.refresh_from_db()
    assert row.updated_at == first_written  # the same reference: nothing written
    post(client, fake_teams, teams.message_activity("ya estoy", service_url=emea))
    row.refresh_from_db()
    assert row.address["serviceUrl"] == emea and row.updated_at > first_written
    assert PlatformAddress.objects.count() == 1 and InboundMessage.objects.count() == 3


def test_an_unchanged_address_committed_costs_no_statement(bot, django_capture_on_commit_callbacks):
    reference = {"serviceUrl": "https://smba.trafficmanager.net/amer/", "conversationId": "19:a@thread.v2"}
    with django_capture_on_commit_callbacks(execute=True):
        assert addresses.remember(bot.pk, "19:a@thread.v2", {**reference, "x": "", "y": "z" * 2000})
    assert PlatformAddress.objects.get().address == reference  # empty and oversized values left out
    with CaptureQueriesContext(connection) as captured:
        assert not addresses.remember(bot.pk, "19:a@thread.v2", reference)
    assert not captured.captured_queries
    assert not addresses.remember(bot.pk, "19:a@thread.v2", None) and not addresses.remember(bot.pk, "c", {})


def test_a_reply_goes_to_the_service_url_of_the_chats_last_activity(client, bot, fake_teams):
    post(client, fake_teams, teams.message_activity("hola", service_url=fake_teams.region_url("amer")))
    send(bot)
    run(TeamsTransport(bot).send_typing(Target(teams.USER)))
    [reply], [typing] = fake_teams.calls("create"), fake_teams.calls("typing")
    assert (reply.service, reply.conversation) == ("amer", PERSONAL) == (typing.service, typing.conversation)
    assert not fake_teams.calls("conversation")  # the reference's conversation id: nothing asked
    post(client, fake_teams, teams.message_activity("otra", service_url=fake_teams.region_url("emea")))
    send(bot)
    assert fake_teams.calls("create")[-1].service == "emea"
    # Another process reads it from the database (nothing cached).
    addresses.forget_cached()
    assert addresses.address_for(bot, Target(teams.USER))["serviceUrl"] == fake_teams.region_url("emea")


def test_a_chat_no_activity_came_from_goes_to_the_setting(client, bot, fake_teams):
    post(client, fake_teams, teams.message_activity("hola", service_url=fake_teams.region_url("amer")))
    send(bot, chat_id=teams.OTHER_USER)  # a proactive first message to another person
    send(bot, chat_id=GROUP_CHAT)
    [asked] = fake_teams.calls("conversation")
    assert asked.service == "" and asked.body["members"] == [{"id": teams.OTHER_USER}]
    to_person, to_group = fake_teams.calls("create")
    assert (to_person.service, to_person.conversation) == ("", teams.personal_conversation(teams.OTHER_USER))
    assert (to_group.service, to_group.conversation) == ("", GROUP_CHAT)


def test_erasure_takes_the_persons_chat_address_and_leaves_a_groups(client, bot, fake_teams):
    amer = fake_teams.region_url("amer")
    post(client, fake_teams, teams.message_activity("hola", service_url=amer))
    for user in (teams.USER, teams.OTHER_USER):
        post(client, fake_teams, teams.message_activity("en grupo", kind="groupChat", user=user, service_url=amer))
    counts = erasure.forget(bot.slug, teams.USER, by="test", wait=1)
    assert counts["addresses"] == 1
    assert list(PlatformAddress.objects.values_list("chat_id", flat=True)) == [GROUP_CHAT]  # the group's, not theirs
    assert addresses.address_for(bot, Target(teams.USER)) is None
    send(bot)  # their next reply (a proactive one): by the setting again
    assert fake_teams.calls("create")[-1].service == "" and fake_teams.calls("conversation")


def test_retention_sweeps_an_address_with_its_chats_messages(client, bot, fake_teams):
    post(client, fake_teams, teams.message_activity("hola", service_url=fake_teams.region_url("amer")))
    addresses.remember(bot.pk, "19:old@thread.v2", {"serviceUrl": fake_teams.region_url(), "conversationId": "19:old"})
    long_ago = timezone.now() - timedelta(days=400)
    PlatformAddress.objects.update(created_at=long_ago, updated_at=long_ago)
    retention.sweep()
    assert list(PlatformAddress.objects.values_list("chat_id", flat=True)) == [teams.USER]  # its message is recent


@pytest.mark.django_db(transaction=True)
def test_an_image_is_fetched_with_the_token_from_a_stored_service_urls_host_only(make_channel, fake_teams):
    from conversations.media.download import FileUnavailable
    from conversations.platforms.teams import TeamsPlatform

    bot = teams_channel(make_channel, fake_teams, service_url="https://smba.example.invalid/")
    image, platform = fake_teams.add_attachment(b"\x89PNG one"), TeamsPlatform()
    with pytest.raises(FileUnavailable):  # no activity came from the fake's host yet: no token sent
        run(platform.fetch_media(bot, image, 1024))
    assert fake_teams.downloads()[-1][1] == ""
    addresses.remember(bot.pk, teams.USER, {"serviceUrl": fake_teams.region_url(), "conversationId": PERSONAL})
    assert run(platform.fetch_media(bot, image, 1024)) == b"\x89PNG one"
    assert fake_teams.downloads()[-1][1].startswith("Bearer ")
