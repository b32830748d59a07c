"""Discord, in process: dispatches parsed (DMs, guild mention gating, threads, edits,
deletions, our own messages ignored); the Gateway session against the fake Gateway
(IDENTIFY, heartbeats, a drop resumed from the stored session and sequence number with
nothing doubled, a new session after INVALID_SESSION, a wrong token); the REST answers
mapped to the ledger's outcomes, the buckets kept, typing.

End to end with the real worker: tests/end_to_end/test_discord_e2e.py."""

import asyncio
import time

import discord
import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError

from conversations.deletions import Deletion
from conversations.edits import Edit
from conversations.ingest import Inbound
from conversations.models import Channel, InboundMessage, MessageBuffer
from conversations.platforms import get as platform
from conversations.platforms.connection import admit_received
from conversations.platforms.discord import inbound
from conversations.platforms.discord.gateway import GatewayRefused, GatewaySession
from delivery.models import Outcome
from delivery.transports import Target
from tests.fakes.discord_api import BOT_USER_ID, DiscordGateway, DiscordRest, message

TOKEN = "discord-bot-t0ken"
DM, GUILD_CHANNEL, THREAD = "500000000000000001", "500000000000000002", "500000000000000003"


def test_a_dm_is_an_inbound_threaded_to_itself():
    found = inbound.parse("MESSAGE_CREATE", message("1001", DM, "hola"), BOT_USER_ID)
    assert isinstance(found, Inbound)
    assert (found.platform_message_id, found.chat_id, found.sender_id, found.text) == ("1001", DM, "300000000000000001", "hola")
    assert (found.reply_target, found.is_group, found.mentioned, found.sender_name) == ("1001", False, None, "Ana")
    assert found.sent_at is not None


def test_a_guild_message_is_addressed_only_when_it_mentions_the_bot():
    plain = inbound.parse("MESSAGE_CREATE", message("1", GUILD_CHANNEL, "hola", guild_id="7"), BOT_USER_ID)
    mentioned = inbound.parse("MESSAGE_CREATE", message("2", GUILD_CHANNEL, f"<@{BOT_USER_ID}> hola", guild_id="7",
                                                        mentions=(BOT_USER_ID,)), BOT_USER_ID)
    other = inbound.parse("MESSAGE_CREATE", message("3", THREAD, "<@42> hola", guild_id="7", mentions=("42",)), BOT_USER_ID)
    assert plain.is_group and plain.mentioned is False
    assert mentioned.mentioned is True and mentioned.text == "hola"
    assert other.mentioned is False and other.chat_id == THREAD  # a thread is a chat of its own


def test_a_reply_to_the_bot_is_addressed():
    data = {**message("4", GUILD_CHANNEL, "sí", guild_id="7"),
            "referenced_message": {"id": "3", "author": {"id": BOT_USER_ID}}}
    assert inbound.parse("MESSAGE_CREATE", data, BOT_USER_ID).mentioned is True


def test_own_messages_empty_ones_other_events_and_malformed_ones_are_nothing():
    assert inbound.parse("MESSAGE_CREATE", message("1", DM, "hola", author=BOT_USER_ID), BOT_USER_ID) is None
    assert inbound.parse("MESSAGE_CREATE", message("1", DM, ""), BOT_USER_ID) is None
    assert inbound.parse("TYPING_START", {"channel_id": DM}, BOT_USER_ID) is None
    assert inbound.parse("MESSAGE_CREATE", "not an object", BOT_USER_ID) is None
    assert inbound.parse("MESSAGE_CREATE", {"id": "1"}, BOT_USER_ID) is None


def test_edits_and_deletions():
    edit = inbound.parse("MESSAGE_UPDATE", {**message("1", DM, "hola, mañana"),
                                            "edited_timestamp": "2026-12-06T10:01:00+00:00"}, BOT_USER_ID)
    assert isinstance(edit, Edit) and (edit.platform_message_id, edit.text, edit.chat_id) == ("1", "hola, mañana", DM)
    assert inbound.parse("MESSAGE_UPDATE", {"id": "1", "channel_id": DM, "embeds": []}, BOT_USER_ID) is None
    deletion = inbound.parse("MESSAGE_DELETE", {"id": "1", "channel_id": DM}, BOT_USER_ID)
    assert isinstance(deletion, Deletion) and deletion.platform_message_id == "1"


def test_an_edit_and_a_deletion_go_through_intake_and_a_copy_stops_at_the_dedup(make_channel):
    channel = make_channel("dc", kind="discord", poll_owner="tester", poll_session={"bot_user_id": BOT_USER_ID},
                           platform_settings={"bot_token": TOKEN})
    connection = platform("discord").connection()

    def received(event, data):
        return admit_received(connection, channel.pk, "tester", [{"t": event, "d": data}], 1)

    assert received("MESSAGE_CREATE", message("1", DM, "hola, para mañna")) == 1
    assert received("MESSAGE_CREATE", message("1", DM, "hola, para mañna")) == 0  # sent again after a resume
    assert received("MESSAGE_UPDATE", {**message("1", DM, "hola, para mañana"),
                                       "edited_timestamp": "2026-12-06T10:00:30+00:00"}) == 1
    assert InboundMessage.objects.get().text == "hola, para mañana"
    received("MESSAGE_DELETE", {"id": "1", "channel_id": DM})  # all its buffer held: the buffer dropped
    assert InboundMessage.objects.get().deleted_at is not None
    assert received("MESSAGE_DELETE", {"id": "1", "channel_id": DM}) == 0
    assert not MessageBuffer.objects.filter(state="open").exists()
    assert received("MESSAGE_CREATE", "not an object") == 0


# --- the Gateway ------------------------------------------------------------------------------


@pytest.fixture
def servers():
    with DiscordGateway(TOKEN, heartbeat_ms=300) as gateway, DiscordRest(TOKEN, gateway.url) as rest:
        yield gateway, rest


@pytest.fixture
def channel(transactional_db, servers):
    return Channel.objects.create(slug="dc", kind="discord", poll_owner="tester",
                                  platform_settings={"bot_token": TOKEN, "api_base": servers[1].url})


async def _session(channel_id, until, timeout=10.0):
    """One GatewaySession as the worker runs it (the stored channel, its cursor, the real
    admission), ended once `until()` holds or the socket drops."""
    connection = platform("discord").connection()

    async def receive(payloads, cursor):
        return await sync_to_async(admit_received)(connection, channel_id, "tester", payloads, cursor)

    stored = await sync_to_async(Channel.objects.get)(pk=channel_id)
    session = asyncio.create_task(GatewaySession(stored, stored.poll_offset, receive).run())
    deadline = time.monotonic() + timeout
    while not session.done() and not await sync_to_async(until)():
        assert time.monotonic() < deadline, "the session did not get there in time"
        await asyncio.sleep(0.05)
    if not session.done():
        session.cancel()
    return await asyncio.gather(session, return_exceptions=True)


def _in_thread(call):
    """Run `call` (the fake's side) off the event loop, as the platform would act."""
    return asyncio.to_thread(call)


def test_identify_then_messages_admitted_and_the_session_stored(servers, channel):
    gateway, _ = servers

    async def scenario():
        async def talk():
            while not gateway.connected():
                await asyncio.sleep(0.02)
            for number in (1, 2):
                await _in_thread(lambda n=number: gateway.dispatch("MESSAGE_CREATE", message(f"10{n}", DM, f"m{n}")))
        talking = asyncio.create_task(talk())
        await _session(channel.pk, lambda: InboundMessage.objects.count() == 2 and gateway.heartbeats >= 2)
        await talking

    asyncio.run(scenario())
    channel.refresh_from_db()
    assert gateway.identifies == 1 and gateway.resumes == []
    assert channel.poll_session["session_id"] == gateway.session_id and channel.poll_offset == 3  # READY, m1, m2
    assert channel.poll_session["bot_user_id"] == BOT_USER_ID


def test_a_drop_resumes_from_the_stored_sequence_and_nothing_is_doubled(servers, channel):
    gateway, _ = servers

    async def scenario():
        async def first():
            while not gateway.connected():
                await asyncio.sleep(0.02)
            await _in_thread(lambda: gateway.dispatch("MESSAGE_CREATE", message("201", DM, "uno")))
        talking = asyncio.create_task(first())
        await _session(channel.pk, lambda: InboundMessage.objects.count() == 1)
        await talking
        await _in_thread(gateway.drop)
        # While no one is connected, Discord keeps the session's dispatches for a RESUME.
        await _in_thread(lambda: gateway.dispatch("MESSAGE_CREATE", message("202", DM, "dos")))
        # The stored cursor is set back one: as if the process died between the admission
        # and the cursor — Discord sends m1 again, the dedup drops it.
        await sync_to_async(Channel.objects.filter(pk=channel.pk).update)(poll_offset=1)
        await _session(channel.pk, lambda: InboundMessage.objects.count() == 2)

    asyncio.run(scenario())
    session_id = Channel.objects.get(pk=channel.pk).poll_session["session_id"]
    assert gateway.identifies == 1 and gateway.resumes == [(session_id, 1)]
    assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == ["201", "202"]


def test_an_invalid_session_is_followed_by_a_new_one(servers, channel):
    gateway, _ = servers
    asyncio.run(_session(channel.pk, lambda: gateway.identifies == 1 and Channel.objects.get(pk=channel.pk).poll_offset))
    gateway.invalidate()  # forgotten by Discord: the RESUME is refused, a new IDENTIFY follows

    async def scenario():
        ended = await _session(channel.pk, lambda: False, timeout=10)  # ends on INVALID_SESSION (after 1-5 s)
        assert ended == [None]
        # Until the new session is stored, not only asked for: the fake counts an IDENTIFY
        # before its READY reaches the client (once, starved, the session was cancelled between).
        await _session(channel.pk, lambda: gateway.identifies == 2 and _stored_session(channel.pk) == gateway.session_id)

    asyncio.run(scenario())
    assert len(gateway.resumes) == 1
    assert _stored_session(channel.pk) == gateway.session_id


def _stored_session(channel_id):
    return (Channel.objects.get(pk=channel_id).poll_session or {}).get("session_id")


def test_unacknowledged_heartbeats_end_the_session_for_a_resume(servers, channel):
    gateway, _ = servers
    gateway.ack_heartbeats = False
    ended = asyncio.run(_session(channel.pk, lambda: False, timeout=10))
    assert ended == [None] and gateway.heartbeats >= 1


def test_a_wrong_token_is_refused_loudly(servers, channel):
    Channel.objects.filter(pk=channel.pk).update(platform_settings={"bot_token": "wrong", "api_base": servers[1].url})
    ended = asyncio.run(_session(channel.pk, lambda: False, timeout=10))
    assert isinstance(ended[0], GatewayRefused)


# --- REST: replies, outcomes, buckets ----------------------------------------------------------


def _send(channel, text="hola", chat=DM, reply_target="1001"):
    transport = platform("discord").transport(channel)

    async def go():
        try:
            return await transport.send_text(Target(chat_id=chat, reply_target=reply_target), text)
        finally:
            await platform("discord").close_clients()

    return asyncio.run(go())


def test_a_reply_is_threaded_to_the_message(servers, channel):
    result = _send(channel)
    assert result.ok and result.platform_message_id == servers[1].messages[0]["id"]
    assert servers[1].messages[0]["message_reference"] == {"message_id": "1001", "fail_if_not_exists": False}


@pytest.mark.parametrize(("status", "outcome", "unreachable"), [
    (500, Outcome.TEMPORARY, True), (502, Outcome.TEMPORARY, True), (401, Outcome.CHANNEL_BLOCKED, True),
    (400, Outcome.PERMANENT, False)])
def test_refusals_are_mapped_once(servers, channel, status, outcome, unreachable):
    servers[1].fail_next = [status]
    result = _send(channel)
    assert (result.outcome, result.chat_unreachable) == (outcome, unreachable)


def test_unknown_and_forbidden_channels_are_permanent(servers, channel):
    servers[1].unknown.add("404404")
    servers[1].forbidden.add("403403")
    unknown, forbidden = _send(channel, chat="404404"), _send(channel, chat="403403")
    assert unknown.outcome == forbidden.outcome == Outcome.PERMANENT
    assert "Unknown Channel" in unknown.error and "Missing Access" in forbidden.error


def test_a_global_429_is_a_flood_after_retry_after(servers, channel):
    servers[1].flood_next, servers[1].retry_after = 1, 2.5
    result = _send(channel)
    assert result.outcome == Outcome.FLOOD and result.retry_after == 2.5 and "global" in result.error


def test_an_empty_bucket_is_waited_out_before_sending(servers, channel):
    results = [_send(channel, text=f"r{n}", chat=GUILD_CHANNEL) for n in range(6)]
    assert all(result.ok for result in results[:5])
    # The fifth answer said Remaining: 0: the sixth is not sent, a flood until the reset.
    assert results[5].outcome == Outcome.FLOOD and 0 < results[5].retry_after <= 5.0
    assert len(servers[1].messages) == 5 and servers[1].refused == []


def test_a_429_of_the_route_is_a_flood(servers, channel):
    for n in range(5):
        assert servers[1].answer("POST", f"/api/v10/channels/{THREAD}/messages", {"authorization": f"Bot {TOKEN}"},
                                 {"content": f"x{n}"})[0] == 200  # another process's sends, unseen here
    result = _send(channel, chat=THREAD)
    assert result.outcome == Outcome.FLOOD and 0 < result.retry_after <= 5.0


def test_an_unreachable_api_is_not_sent(channel):
    Channel.objects.filter(pk=channel.pk).update(platform_settings={"bot_token": TOKEN, "api_base": "http://127.0.0.1:9/api/v10"})
    assert _send(Channel.objects.get(pk=channel.pk)).outcome == Outcome.NOT_SENT


def test_typing_is_posted_to_the_channel(servers, channel):
    transport = platform("discord").transport(channel)

    async def go():
        await transport.send_typing(Target(chat_id=DM))
        await platform("discord").close_clients()

    asyncio.run(go())
    assert servers[1].typing == [DM] and transport.typing_refresh < 10


def test_discord_py_reads_the_fakes_answers_as_discords(servers, monkeypatch):
    """The fake speaks Discord's REST protocol: discord.py's own HTTPClient, pointed at it,
    waits out its global 429 (`retry_after`, `global`, Via) and raises its typed errors
    with Discord's codes for its 403 and 404."""
    _, rest = servers
    rest.flood_next, rest.retry_after = 1, 0.2
    rest.unknown.add("404404")
    rest.forbidden.add("403403")
    monkeypatch.setattr(discord.http.Route, "BASE", rest.url)

    async def go():
        client = discord.http.HTTPClient(asyncio.get_running_loop())
        await client.static_login(TOKEN)
        try:
            route = discord.http.Route("POST", "/channels/{channel_id}/messages", channel_id=DM)
            sent = await client.request(route, json={"content": "hola"})
            errors = []
            for chat in ("404404", "403403"):
                try:
                    await client.request(discord.http.Route("POST", "/channels/{channel_id}/messages", channel_id=chat),
                                         json={"content": "hola"})
                except discord.HTTPException as exc:
                    errors.append((type(exc), exc.code))
            return sent, errors
        finally:
            await client.close()

    sent, errors = asyncio.run(go())
    assert sent["id"] == rest.messages[0]["id"] and [status for status, _ in rest.refused] == [429, 404, 403]
    assert errors == [(discord.NotFound, 10003), (discord.Forbidden, 50001)]


def test_the_platforms_settings_secrets_and_what_blocks_sending(make_channel):
    channel = make_channel("dc2", kind="discord", platform_settings={"bot_token": TOKEN})
    assert channel.platform_settings["api_base"] == "https://discord.com/api/v10"
    assert platform("discord").secrets(channel) == [TOKEN]
    assert platform("discord").send_blocked(Channel(kind="discord", platform_settings={})) == "no bot_token set"
    assert platform("discord").missing_to_run({}) == ["bot_token"]
    with pytest.raises(ValidationError):
        platform("discord").clean_settings({"bot_token": TOKEN, "api_base": "not a url"})
    with pytest.raises(ValidationError):
        platform("discord").clean_settings({"bot_token": TOKEN, "webhook_secret": "x"})


def test_buttons_go_as_components_and_a_tap_is_parsed(servers, channel):
    transport = platform("discord").transport(channel)
    buttons = (("✅ Yes, do it", "c:abcdefghijklmnop:y"), ("❌ No", "c:abcdefghijklmnop:n"))

    async def go():
        try:
            return await transport.send_text(Target(chat_id=DM, buttons=buttons), "¿Lo agendo?")
        finally:
            await platform("discord").close_clients()

    assert asyncio.run(go()).ok
    [row] = servers[1].messages[0]["components"]
    assert [(b["style"], b["label"], b["custom_id"]) for b in row["components"]] == [
        (3, "✅ Yes, do it", "c:abcdefghijklmnop:y"), (4, "❌ No", "c:abcdefghijklmnop:n")]
    data = servers[1].interaction(servers[1].messages[0]["id"], "c:abcdefghijklmnop:y", "77", GUILD_CHANNEL)
    in_guild = {**{k: v for k, v in data.items() if k != "user"}, "member": {"user": data["user"]}, "guild_id": "1"}
    for payload in (data, in_guild):
        tap = inbound.parse("INTERACTION_CREATE", payload, BOT_USER_ID)
        assert (tap.custom_id, tap.user_id, tap.chat_id, tap.token) == ("c:abcdefghijklmnop:y", "77", GUILD_CHANNEL,
                                                                        data["token"])
    assert inbound.parse("INTERACTION_CREATE", {**data, "type": 2}, BOT_USER_ID) is None  # a slash command


# --- files both ways ---------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _attachment(number, content_type="image/png", size=100, url=None):
    return {"id": f"13{number:016d}", "filename": f"f{number}.png", "size": size, "content_type": content_type,
            "url": url or f"https://cdn.discordapp.com/attachments/{DM}/13{number:016d}/f{number}.png?ex=1&is=2&hm=3&"}


def test_a_messages_attachments_are_files_to_fetch_the_first_with_its_text_the_others_items_of_one_album():
    data = message("1001", DM, "mira", attachments=(_attachment(1), _attachment(2, "application/pdf"),
                                                    {"id": "3", "filename": "x"}))  # no url: nothing to fetch
    first, second = inbound.parse_all("MESSAGE_CREATE", data, BOT_USER_ID)
    assert (first.platform_message_id, first.text, first.media_type, first.album_id) == ("1001", "mira", "image", "1001")
    assert (first.media.key, first.media.ref, first.media.declared_type, first.media.file_name,
            first.media.declared_size) == ("130000000000000001", _attachment(1)["url"], "image/png", "f1.png", 100)
    assert (second.platform_message_id, second.text, second.media_type, second.album_id, second.reply_target) == (
        "1001.1", "", "document", "1001", "1001")
    alone = inbound.parse("MESSAGE_CREATE", message("1002", DM, "", attachments=(_attachment(4, "audio/ogg"),)),
                          BOT_USER_ID)
    assert alone.text == "" and alone.media_type == "audio" and alone.album_id == ""  # a file alone is a message
    voice = {**message("1003", DM, "", attachments=({**_attachment(5, "audio/ogg"), "duration_secs": 2.5},)),
             "flags": 8192}
    assert inbound.parse("MESSAGE_CREATE", voice, BOT_USER_ID).media.kind == "voice"
    assert inbound.parse("MESSAGE_CREATE", message("1004", DM, "", attachments=({"id": "9"},)), BOT_USER_ID) is None


@pytest.fixture
def files_root(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)


def _admit(channel, data):
    connection = platform("discord").connection()
    Channel.objects.filter(pk=channel.pk).update(poll_session={"bot_user_id": BOT_USER_ID})
    return admit_received(connection, channel.pk, "tester", [{"t": "MESSAGE_CREATE", "d": data}], None)


def test_an_attachment_is_admitted_once_then_fetched_from_the_cdn_without_the_token(servers, channel, settings):
    from conversations.media import fetching
    from conversations.models import MediaFile, MediaState

    rest = servers[1]
    photo = rest.attachment(PNG, "foto.png", "image/png", DM)
    assert _admit(channel, message("2001", DM, "", attachments=(photo,))) == 1
    assert _admit(channel, message("2001", DM, "", attachments=(photo,))) == 0  # replayed after a RESUME
    row = MediaFile.objects.select_related("channel").get()
    assert (row.file_key, row.kind, row.state, row.declared_size) == (photo["id"], "image", MediaState.PENDING, len(PNG))
    assert asyncio.run(fetching.fetch(row)) == PNG and rest.downloads == [photo["id"]]
    # Over the cap: a declared size is skipped at the admission, a lying one cut while read.
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 10
    _admit(channel, message("2002", DM, "", attachments=(rest.attachment(b"y" * 11, "b.bin", "application/zip", DM),)))
    assert MediaFile.objects.get(file_name="b.bin").state == MediaState.SKIPPED
    lying = {**rest.attachment(b"z" * 64, "c.png", "image/png", DM), "size": 5}
    _admit(channel, message("2003", DM, "", attachments=(lying,)))
    from conversations.media.download import FileTooLarge, FileUnavailable

    with pytest.raises(FileTooLarge):
        asyncio.run(fetching.fetch(MediaFile.objects.select_related("channel").get(file_name="c.png")))
    # A URL whose signature Discord no longer honours: for good, the signature masked.
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 1000
    expired = photo["url"].replace("hm=", "hm=0")
    with pytest.raises(FileUnavailable) as refused:
        asyncio.run(platform("discord").fetch_media(channel, expired, 1000))
    assert refused.value.permanent
    with pytest.raises(FileUnavailable) as nothing:
        asyncio.run(platform("discord").fetch_media(channel, "not a url", 1000))
    assert nothing.value.permanent
    # A CDN that does not answer in time: worth another try, within the deadline.
    settings.AGENTLOOP_MEDIA_FETCH_DEADLINE, rest.download_delay = 0.3, 1.0
    started = time.monotonic()
    with pytest.raises(FileUnavailable) as late:
        asyncio.run(platform("discord").fetch_media(channel, photo["url"], 1000))
    assert not late.value.permanent and "0.3 s" in str(late.value) and time.monotonic() - started < 0.9


def _stored(channel, data, name, content_type):
    from delivery.attachments import OutboundFile, store

    return OutboundFile(store(channel.pk, data), name, content_type, len(data))


def _transport_call(channel, method, *args):
    transport = platform("discord").transport(channel)

    async def go():
        try:
            return await getattr(transport, method)(*args)
        finally:
            await platform("discord").close_clients()

    return asyncio.run(go())


def test_a_file_goes_as_multipart_payload_json_and_files_0_threaded_with_its_caption(servers, channel, files_root):
    rest = servers[1]
    item = _stored(channel, b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n", "cita.ics", "text/calendar")
    result = _transport_call(channel, "send_files", Target(chat_id=DM, reply_target="1001"), [item], "Tu cita")
    [sent] = rest.messages
    assert result.ok and result.platform_message_id == sent["id"]
    assert (sent["content"], sent["message_reference"]["message_id"]) == ("Tu cita", "1001")
    [attached] = sent["attachments"]
    assert (attached["filename"], attached["content_type"], attached["data"]) == (
        "cita.ics", "text/calendar", b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n")
    bare = _transport_call(channel, "send_files", Target(chat_id=DM), [item], "")  # no caption: the file alone
    assert bare.ok and rest.messages[1]["content"] == "" and len(rest.messages[1]["attachments"]) == 1


def test_a_file_over_25_mib_is_refused_before_sending_and_discords_413_is_permanent(servers, channel, files_root):
    from delivery.attachments import OutboundFile

    rest = servers[1]
    huge = OutboundFile("outbound/none", "video.mp4", "video/mp4", 25 * 1024 * 1024 + 1)
    result = _transport_call(channel, "send_files", Target(chat_id=DM), [huge], "")
    assert (result.outcome, result.chat_unreachable) == (Outcome.PERMANENT, False) and "25 MiB" in result.error
    rest.upload_limit = 10  # a server whose limit is lower: Discord's own refusal
    refused = _transport_call(channel, "send_files", Target(chat_id=DM), [_stored(channel, PNG, "a.png", "image/png")], "")
    assert (refused.outcome, refused.chat_unreachable) == (Outcome.PERMANENT, False) and "40005" in refused.error
    assert rest.messages == [] and [status for status, _ in rest.refused] == [413]


def test_discord_py_uploads_a_file_the_fake_reads_as_discord_would(servers, monkeypatch):
    """The fake's multipart is Discord's: discord.py's own upload (payload_json, files[0])."""
    _, rest = servers
    monkeypatch.setattr(discord.http.Route, "BASE", rest.url)

    async def go():
        import io

        client = discord.http.HTTPClient(asyncio.get_running_loop())
        await client.static_login(TOKEN)
        try:
            with discord.http.handle_message_parameters(content="adjunto", file=discord.File(io.BytesIO(PNG),
                                                                                                "a.png")) as params:
                return await client.send_message(DM, params=params)
        finally:
            await client.close()

    sent = asyncio.run(go())
    assert sent["attachments"][0]["filename"] == "a.png" and rest.messages[0]["attachments"][0]["data"] == PNG
    assert rest.messages[0]["content"] == "adjunto"


# --- previews of a streamed reply, edits, deletions, reactions -------------------------------------


def test_a_preview_is_one_threaded_message_edited_then_the_final_edit_keeps_the_buttons(servers, channel):
    from delivery.transports import Capability, transport_for

    rest = servers[1]
    transport = platform("discord").transport(channel)
    target = Target(chat_id=DM, reply_target="1001")

    async def stream():
        try:
            preview = transport.preview_for(target, turn_id=1)
            shown = [await preview.show(text) for text in ("Hola ▍", "Hola ▍", "Hola, sí ▍")]
            final = await transport.edit_text(Target(DM, buttons=(("Sí", "c:tok:y"), ("No", "c:tok:n"))),
                                              shown[0].message_id, "Hola, sí. ¿Lo agendo?")
            return preview, shown, final
        finally:
            await platform("discord").close_clients()

    preview, shown, final = asyncio.run(stream())
    [message_sent] = rest.messages
    assert preview.is_message and shown[0].shown and not shown[1].shown and shown[2].shown  # the same text: no call
    assert shown[0].message_id == shown[2].message_id == final.platform_message_id == message_sent["id"]
    assert message_sent["message_reference"]["message_id"] == "1001" and len(rest.edits) == 2
    assert message_sent["content"] == "Hola, sí. ¿Lo agendo?" and len(message_sent["components"][0]["components"]) == 2
    assert {Capability.PREVIEWS, Capability.EDIT, Capability.DELETE, Capability.FILES, Capability.REACTIONS,
            Capability.TYPING} == set(type(transport_for(channel)).capabilities())


def test_a_discarded_preview_is_deleted_and_deleting_it_again_is_done(servers, channel):
    rest = servers[1]
    transport = platform("discord").transport(channel)

    async def go():
        try:
            preview = transport.preview_for(Target(DM), turn_id=2)
            shown = await preview.show("Un momento ▍")
            await preview.discard()
            return shown, await transport.delete_message(Target(DM), shown.message_id)
        finally:
            await platform("discord").close_clients()

    shown, again = asyncio.run(go())
    assert rest.deleted == [shown.message_id] and rest.messages == [] and again.ok


def test_edits_past_the_channels_edit_bucket_are_a_flood_and_a_gone_message_is_not_the_chats_fault(servers, channel):
    rest = servers[1]
    sent = _send(channel)
    results = [_transport_call(channel, "edit_text", Target(DM), sent.platform_message_id, f"v{n}") for n in range(6)]
    assert all(result.ok for result in results[:5]) and results[5].outcome == Outcome.FLOOD
    assert rest.edits_refused == 0  # the fifth answer's Remaining: 0 was kept: the sixth never left
    gone = _transport_call(channel, "edit_text", Target(GUILD_CHANNEL), "1234", "x")  # (another bucket)
    assert (gone.outcome, gone.chat_unreachable) == (Outcome.PERMANENT, False) and "10008" in gone.error
    # A preview meeting the empty bucket says flood: its previews stop, the final pays nothing.
    from conversations.platforms.discord.transport import MessagePreview

    async def show():
        try:
            return await MessagePreview(platform("discord").transport(channel), Target(DM),
                                        sent.platform_message_id).show("v6 ▍")
        finally:
            await platform("discord").close_clients()

    shown = asyncio.run(show())
    assert shown.flood and not shown.shown and len(rest.edits) == 5


def test_a_long_preview_shows_its_first_message_still_unfinished(servers, channel):
    transport = platform("discord").transport(channel)

    async def go():
        try:
            return await transport.preview_for(Target(DM), turn_id=3).show("x" * 2500 + " ▍")
        finally:
            await platform("discord").close_clients()

    assert asyncio.run(go()).shown
    assert len(servers[1].messages[0]["content"]) == 2000 and servers[1].messages[0]["content"].endswith("▍")


def test_a_status_reaction_is_put_then_replaced(servers, channel):
    rest = servers[1]
    transport = platform("discord").transport(channel)
    seen, done = transport.status_reactions

    async def go():
        try:
            await transport.set_reaction(Target(DM), "1001", seen)
            await transport.set_reaction(Target(DM), "1001", done, previous=seen)
            await transport.set_reaction(Target(DM), "1001", "", previous=seen)  # already gone: fine
        finally:
            await platform("discord").close_clients()

    asyncio.run(go())
    assert rest.reactions == {"1001": ["✅"]}
    assert rest.reaction_calls == [("PUT", "1001", "👀"), ("DELETE", "1001", "👀"), ("PUT", "1001", "✅"),
                                   ("DELETE", "1001", "👀")]
