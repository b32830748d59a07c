"""The Telegram Bot API fake, driven by the real python-telegram-bot client.

Every test talks HTTP to a real server on 127.0.0.1; nothing is mocked.
Run with: .venv/bin/python -m pytest -q -p no:django tests/end_to_end/test_fake_telegram_api.py
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import hashlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import telegram
from telegram.error import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
)

from tests.fakes.telegram_api import FakeBotAPI
from tests.support import local_http

TOKEN = "123456:TEST-token"
OTHER_TOKEN = "654321:OTHER-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake():
    with FakeBotAPI() as server:
        yield server


def make_bot(fake: FakeBotAPI, token: str = TOKEN) -> telegram.Bot:
    # A fresh Bot per event loop: its httpx client is bound to the loop that created it.
    return telegram.Bot(token, base_url=f"{fake.url}/bot")


def seconds(value: int | dtm.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dtm.timedelta) else value


# ------------------------------------------------------------------- messages


def test_send_message_returns_message_and_records_call(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            assert bot.username == "agentloop_test_bot"
            assert bot.id == 123456
            return await bot.send_message(
                chat_id=42,
                text="123",
                message_thread_id=7,
                reply_parameters=telegram.ReplyParameters(message_id=5),
            )

    message = asyncio.run(scenario())

    assert isinstance(message, telegram.Message)
    assert message.text == "123"
    assert message.chat.id == 42
    assert message.chat.type == "private"
    assert message.from_user.is_bot
    assert message.message_thread_id == 7
    assert message.reply_to_message.message_id == 5
    [call] = fake.calls("sendMessage")
    assert call.token == TOKEN
    assert call.params["chat_id"] == 42
    assert call.params["text"] == "123"  # kept a string although it looks like JSON
    assert call.params["reply_parameters"] == {"message_id": 5}
    assert [c.method for c in fake.calls()] == ["getMe", "sendMessage"]


def test_message_ids_increase_per_chat(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            first = await bot.send_message(chat_id=1, text="a")
            second = await bot.send_message(chat_id=1, text="b")
            group = await bot.send_message(chat_id=-100200, text="c")
            return first, second, group

    first, second, group = asyncio.run(scenario())

    assert second.message_id == first.message_id + 1
    assert group.message_id == 1
    assert group.chat.type == "supergroup"


def test_send_chat_action(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            return await bot.send_chat_action(chat_id=42, action="typing")

    assert asyncio.run(scenario()) is True
    [call] = fake.calls("sendChatAction")
    assert call.params == {"chat_id": 42, "action": "typing"}


# -------------------------------------------------------------------- updates


def test_get_updates_returns_pushed_updates_and_offsets_confirm(fake):
    pushed = [fake.push_message(TOKEN, 42, f"msg {i}") for i in range(3)]
    ids = [update["update_id"] for update in pushed]
    assert ids == sorted(ids) and len(set(ids)) == 3

    async def scenario():
        async with make_bot(fake) as bot:
            everything = await bot.get_updates()
            from_second = await bot.get_updates(offset=ids[1])
            after_all = await bot.get_updates(offset=ids[2] + 1)
            # Confirmed updates are gone even without an offset.
            afterwards = await bot.get_updates()
            return everything, from_second, after_all, afterwards

    everything, from_second, after_all, afterwards = asyncio.run(scenario())

    assert all(isinstance(update, telegram.Update) for update in everything)
    assert [u.message.text for u in everything] == ["msg 0", "msg 1", "msg 2"]
    assert everything[0].message.chat.id == 42
    assert everything[0].message.from_user.first_name == "Ana"
    assert [u.update_id for u in from_second] == ids[1:]
    assert after_all == ()
    assert afterwards == ()


def test_get_updates_limit_and_commands(fake):
    fake.push_message(TOKEN, 42, "/start hello")
    fake.push_message(TOKEN, 42, "second")

    async def scenario():
        async with make_bot(fake) as bot:
            return await bot.get_updates(limit=1)

    [update] = asyncio.run(scenario())
    assert update.message.text == "/start hello"
    assert update.message.entities[0].type == "bot_command"
    assert update.message.entities[0].length == len("/start")


def test_long_poll_returns_as_soon_as_an_update_is_pushed(fake):
    def push_once_polling():
        fake.wait_for("getUpdates")
        fake.push_message(TOKEN, 42, "wake up")

    pusher = threading.Thread(target=push_once_polling)
    pusher.start()

    async def scenario():
        async with make_bot(fake) as bot:
            started = time.monotonic()
            updates = await bot.get_updates(timeout=5)
            return updates, time.monotonic() - started

    updates, elapsed = asyncio.run(scenario())
    pusher.join(timeout=5)

    assert [u.message.text for u in updates] == ["wake up"]
    assert elapsed < 2, f"long poll took {elapsed:.2f}s; it should return on push"


def test_long_poll_without_updates_waits_for_the_timeout(fake):
    started = time.monotonic()
    response = local_http.post(f"{fake.url}/bot{TOKEN}/getUpdates", data={"timeout": "0.3"})
    elapsed = time.monotonic() - started

    assert response.json() == {"ok": True, "result": []}
    assert elapsed >= 0.3


def test_forget_offsets_re_serves_confirmed_updates(fake):
    update = fake.push_message(TOKEN, 42, "again")

    async def scenario():
        async with make_bot(fake) as bot:
            confirmed = await bot.get_updates(offset=update["update_id"] + 1)
            fake.forget_offsets = True
            re_served = await bot.get_updates(offset=update["update_id"] + 1)
            fake.forget_offsets = False
            normal = await bot.get_updates(offset=update["update_id"] + 1)
            return confirmed, re_served, normal

    confirmed, re_served, normal = asyncio.run(scenario())

    assert confirmed == ()
    assert [u.message.text for u in re_served] == ["again"]
    assert normal == ()


def test_updates_are_per_token(fake):
    fake.push_message(OTHER_TOKEN, 1, "not for you")

    async def scenario():
        async with make_bot(fake) as bot:
            return await bot.get_updates()

    assert asyncio.run(scenario()) == ()


# ------------------------------------------------------------ scripted errors


@pytest.mark.parametrize(
    ("status", "description", "expected"),
    [
        (403, "Forbidden: bot was blocked by the user", Forbidden),
        (400, "Bad Request: chat not found", BadRequest),
        (500, "Internal Server Error", NetworkError),
        (502, "Bad Gateway", NetworkError),
    ],
)
def test_fail_next_raises_the_matching_telegram_error(fake, status, description, expected):
    fake.fail_next("sendMessage", status=status, description=description)

    async def scenario():
        async with make_bot(fake) as bot:
            with pytest.raises(expected) as excinfo:
                await bot.send_message(chat_id=42, text="hi")
            # Only the next call fails.
            message = await bot.send_message(chat_id=42, text="hi")
            return excinfo.value, message

    error, message = asyncio.run(scenario())

    assert type(error) is expected  # BadRequest is a NetworkError subclass; be exact
    # PTB strips the "Bad Request: " style prefix and capitalises the rest.
    assert description.split(": ")[-1].lower() in str(error).lower()
    assert message.text == "hi"
    assert len(fake.calls("sendMessage")) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # PTB: int vs timedelta periods
def test_fail_next_429_raises_retry_after(fake):
    fake.fail_next(
        "sendMessage", status=429, description="Too Many Requests: retry after 7", retry_after=7, times=2
    )

    async def scenario():
        async with make_bot(fake) as bot:
            errors = []
            for _ in range(2):
                with pytest.raises(RetryAfter) as excinfo:
                    await bot.send_message(chat_id=42, text="hi")
                errors.append(excinfo.value)
            await bot.send_message(chat_id=42, text="hi")
            return errors

    errors = asyncio.run(scenario())

    assert [seconds(error.retry_after) for error in errors] == [7, 7]


def test_fail_next_can_target_one_token(fake):
    fake.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user", token=OTHER_TOKEN)

    async def scenario():
        async with make_bot(fake) as bot:
            return await bot.send_message(chat_id=42, text="fine")

    assert asyncio.run(scenario()).text == "fine"


def test_dropped_connection_raises_network_error(fake):
    fake.drop_connection_next("sendMessage")

    async def scenario():
        async with make_bot(fake) as bot:
            with pytest.raises(NetworkError):
                await bot.send_message(chat_id=42, text="lost")
            return await bot.send_message(chat_id=42, text="retried")

    assert asyncio.run(scenario()).text == "retried"
    # The request did reach the server before the connection died.
    assert [c.params["text"] for c in fake.calls("sendMessage")] == ["lost", "retried"]


def test_hold_blocks_until_released(fake):
    hold = fake.hold("sendMessage")

    async def scenario():
        async with make_bot(fake) as bot:
            task = asyncio.create_task(bot.send_message(chat_id=42, text="later"))
            assert await asyncio.to_thread(hold.wait_held, 1, 5) == 1
            assert not task.done()
            assert len(fake.calls("sendMessage")) == 1  # recorded while held
            hold.release()
            return await task

    assert asyncio.run(scenario()).text == "later"


def test_delay_slows_the_answer(fake):
    fake.delay("sendChatAction", 0.2)

    async def scenario():
        async with make_bot(fake) as bot:
            started = time.monotonic()
            await bot.send_chat_action(chat_id=42, action="typing")
            return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.2


def test_wait_for_times_out_with_a_helpful_message(fake):
    fake.push_message(TOKEN, 1, "x")
    local_http.post(f"{fake.url}/bot{TOKEN}/getUpdates")

    with pytest.raises(AssertionError, match=r"sendMessage.*getUpdates"):
        fake.wait_for("sendMessage", timeout=0.05)


# ------------------------------------------------------------ webhook, tokens


def test_get_updates_conflicts_while_a_webhook_is_set(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            await bot.set_webhook("https://example.test/hook", secret_token="s3cret")
            info = await bot.get_webhook_info()
            with pytest.raises(Conflict, match="webhook is active"):
                await bot.get_updates()
            await bot.delete_webhook()
            return info, await bot.get_updates(), await bot.get_webhook_info()

    info, updates, info_after = asyncio.run(scenario())

    assert info.url == "https://example.test/hook"
    assert updates == ()
    assert info_after.url == ""
    assert fake.webhook(TOKEN) is None


def test_webhook_is_remembered_per_token(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            await bot.set_webhook("https://example.test/hook", secret_token="s3cret")

    asyncio.run(scenario())

    assert fake.webhook(TOKEN)["url"] == "https://example.test/hook"
    assert fake.webhook(TOKEN)["secret_token"] == "s3cret"
    assert fake.webhook(OTHER_TOKEN) is None


def test_unknown_tokens_are_rejected_when_required(fake):
    fake.require_known_tokens = True
    fake.add_token(TOKEN)

    async def scenario():
        with pytest.raises(InvalidToken):
            await make_bot(fake, OTHER_TOKEN).initialize()
        async with make_bot(fake, TOKEN) as bot:
            return bot.username

    assert asyncio.run(scenario()) == "agentloop_test_bot"


# -------------------------------------------------------------- raw HTTP side


def test_body_encodings_and_unknown_methods(fake):
    base = f"{fake.url}/bot{TOKEN}"
    with httpx.Client() as client:
        form = client.post(f"{base}/sendMessage", data={"chat_id": "5", "text": "true", "reply_to_message_id": "3"})
        as_json = client.post(f"{base}/sendMessage", json={"chat_id": 5, "text": "hi", "message_thread_id": 9})
        query = client.get(f"{base}/sendChatAction", params={"chat_id": "5", "action": "typing"})
        multipart = client.post(
            f"{base}/sendDocument", data={"chat_id": "5"}, files={"document": ("a.txt", b"hello")}
        )
        lowercase = client.post(f"{base}/getme")
        no_text = client.post(f"{base}/sendMessage", data={"chat_id": "5"})

    assert form.json()["result"]["text"] == "true"
    assert form.json()["result"]["reply_to_message"]["message_id"] == 3
    assert as_json.json()["result"]["message_thread_id"] == 9
    assert query.json() == {"ok": True, "result": True}
    # An upload is kept as its summary, the bytes' digest among it.
    assert multipart.json()["result"]["document"]["file_name"] == "a.txt"
    [document] = fake.calls("sendDocument")
    assert document.params == {"chat_id": 5, "document": {"filename": "a.txt", "content_type": "text/plain", "size": 5,
                                                          "sha256": hashlib.sha256(b"hello").hexdigest()}}
    unknown = httpx.post(f"{base}/sendSticker", data={"chat_id": "5"})
    assert unknown.status_code == 404
    assert unknown.json() == {"ok": False, "error_code": 404, "description": "Not Found: method not found"}
    assert lowercase.json()["result"]["is_bot"] is True
    assert fake.calls("getMe")  # recorded under the canonical name
    assert no_text.status_code == 400
    assert no_text.json()["description"] == "Bad Request: message text is empty"


def test_control_plane_from_plain_http(fake):
    with httpx.Client(base_url=fake.url) as client:
        pushed = client.post(f"/_control/updates/{TOKEN}", json={"chat_id": 42, "text": "from outside"})
        raw = client.post(f"/_control/updates/{TOKEN}", json={"message": {"message_id": 99, "date": 0, "chat": {"id": 1, "type": "private"}, "text": "raw"}})
        updates = client.post(f"/bot{TOKEN}/getUpdates").json()["result"]

        assert client.post("/_control/fail", json={"method": "sendMessage", "status": 429, "description": "Too Many Requests: retry after 3", "retry_after": 3}).json() == {"ok": True, "result": True}
        limited = client.post(f"/bot{TOKEN}/sendMessage", data={"chat_id": "42", "text": "x"})

        client.post("/_control/delay", json={"method": "getMe", "seconds": 0.2})
        started = time.monotonic()
        client.get(f"/bot{TOKEN}/getMe")
        delayed = time.monotonic() - started

        calls = client.get("/_control/calls", params={"method": "sendMessage", "token": TOKEN}).json()["result"]
        client.post("/_control/clear")
        after_clear = client.get("/_control/calls").json()["result"]
        bad = client.post("/_control/fail", json={"method": "sendMessage"})
        missing = client.post("/_control/nope")

    assert pushed.json()["result"]["message"]["text"] == "from outside"
    assert raw.json()["result"]["update_id"] == pushed.json()["result"]["update_id"] + 1
    assert [u["message"]["text"] for u in updates] == ["from outside", "raw"]
    assert limited.status_code == 429
    assert limited.json() == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 3",
        "parameters": {"retry_after": 3},
    }
    assert delayed >= 0.2
    assert [c["params"]["text"] for c in calls] == ["x"]
    assert set(calls[0]) == {"token", "method", "params", "at", "wall"}
    assert after_clear == []
    assert bad.status_code == 400
    assert missing.status_code == 404


def test_runs_as_a_script_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.telegram_api", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, proc.stderr.read() if proc.poll() is not None else "")
        response = local_http.get(f"{url}/bot{TOKEN}/getMe", timeout=5)
        assert response.status_code == 200
        assert response.json()["result"]["id"] == 123456
        calls = local_http.get(f"{url}/_control/calls", timeout=5).json()["result"]
        assert [c["method"] for c in calls] == ["getMe"]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_stop_releases_waiting_requests():
    fake = FakeBotAPI().start()
    hold = fake.hold("getMe")
    results: list[int] = []

    def call_get_me():
        try:
            results.append(local_http.get(f"{fake.url}/bot{TOKEN}/getMe", timeout=5).status_code)
        except httpx.HTTPError:
            results.append(-1)

    caller = threading.Thread(target=call_get_me)
    caller.start()
    hold.wait_held()
    fake.stop()
    caller.join(timeout=5)

    assert not caller.is_alive()
    assert len(results) == 1  # answered or cut off, but never left hanging


# --------------------------------------------------------- buttons and their taps


def keyboard(*buttons: tuple[str, str]) -> telegram.InlineKeyboardMarkup:
    return telegram.InlineKeyboardMarkup(
        [[telegram.InlineKeyboardButton(text, callback_data=data) for text, data in buttons]]
    )


def test_inline_keyboard_tap_answer_and_edit(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            sent = await bot.send_message(
                chat_id=42, text="Confirm?", reply_markup=keyboard(("Yes", "c:tok:y"), ("No", "c:tok:n"))
            )
            assert sent.reply_markup.inline_keyboard[0][1].callback_data == "c:tok:n"
            update = telegram.Update.de_json(
                fake.callback_query(TOKEN, sent.to_dict(), "c:tok:y", user_id=42), bot
            )
            query = update.callback_query
            assert (query.data, query.from_user.id, query.message.message_id) == ("c:tok:y", 42, sent.message_id)
            assert await bot.answer_callback_query(query.id, text="Done ✅") is True
            with pytest.raises(BadRequest, match="(?i)query is too old"):  # answered once only
                await bot.answer_callback_query(query.id, text="again")
            edited = await bot.edit_message_text(chat_id=42, message_id=sent.message_id, text="Confirm?\n\nDone.")
            assert edited.text == "Confirm?\n\nDone." and edited.reply_markup is None
            with pytest.raises(BadRequest, match="(?i)message is not modified"):
                await bot.edit_message_text(chat_id=42, message_id=sent.message_id, text="Confirm?\n\nDone.")
            marked = await bot.edit_message_reply_markup(
                chat_id=42, message_id=sent.message_id, reply_markup=keyboard(("Undo", "c:tok:u"))
            )
            assert marked.reply_markup.inline_keyboard[0][0].text == "Undo"
            with pytest.raises(BadRequest, match="(?i)message to edit not found"):
                await bot.edit_message_text(chat_id=42, message_id=999, text="x")

    asyncio.run(scenario())
    shown = fake.sent_message(TOKEN, 42, 1)
    assert shown["text"] == "Confirm?\n\nDone." and shown["reply_markup"]["inline_keyboard"][0][0]["text"] == "Undo"
    answered = fake.calls("answerCallbackQuery")
    assert [call.params.get("text") for call in answered] == ["Done ✅", "again"]
    assert len(fake.calls("editMessageText")) == 3 and len(fake.calls("editMessageReplyMarkup")) == 1


def test_buttons_and_answers_are_validated_like_the_real_api(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            with pytest.raises(BadRequest, match="(?i)button_data_invalid"):
                await bot.send_message(chat_id=42, text="x", reply_markup=keyboard(("Yes", "y" * 65)))
            with pytest.raises(BadRequest, match="(?i)query is too old"):  # an id Telegram never issued
                await bot.answer_callback_query("12345", text="forged")
            query = fake.callback_query(TOKEN, (await bot.send_message(chat_id=42, text="q")).to_dict(), "d")
            with pytest.raises(BadRequest, match="(?i)message_too_long"):
                await bot.answer_callback_query(query["callback_query"]["id"], text="x" * 201)
            assert await bot.answer_callback_query(query["callback_query"]["id"], text="x" * 200) is True

    asyncio.run(scenario())
    for body, error in [
        ({"text": "x"}, 'parameter "callback_query_id" is required'),
    ]:
        answer = local_http.post(f"{fake.url}/bot{TOKEN}/answerCallbackQuery", json=body).json()
        assert answer["ok"] is False and error in answer["description"]
    shapes = [
        ({"inline_keyboard": [{"text": "a", "callback_data": "b"}]}, "should be an Array of Arrays"),
        ({"inline_keyboard": [[{"text": "a"}]]}, "BUTTON_TYPE_INVALID"),
        ({"inline_keyboard": [[{"text": "", "callback_data": "b"}]]}, "text buttons are unallowed"),
        ({"inline_keyboard": [[{"text": "a", "callback_data": "b", "url": "https://x"}]]}, "BUTTON_TYPE_INVALID"),
    ]
    for markup, error in shapes:
        answer = local_http.post(f"{fake.url}/bot{TOKEN}/sendMessage",
                            json={"chat_id": 42, "text": "x", "reply_markup": markup}).json()
        assert answer["ok"] is False and error in answer["description"], (markup, answer)


def test_with_limits_it_keeps_telegrams_per_bot_per_chat_and_per_group_limits():
    """Telegram's limits, scaled down: 3 a second per bot, 1 a second per chat, 2 a minute
    per group. Beyond each: 429 with retry_after (whole seconds); sendChatAction is free."""
    from tests.fakes.telegram_api import Limits

    async def scenario(server):
        bot = telegram.Bot(TOKEN, base_url=f"{server.url}/bot")
        async with bot:
            for chat in (1, 2, 3):
                await bot.send_message(chat, "hola")
            with pytest.raises(RetryAfter) as bot_limit:
                await bot.send_message(4, "hola")  # the 4th within a second, from one bot
            await bot.send_chat_action(5, "typing")  # not a message: not counted
            await asyncio.sleep(1.05)
            await bot.send_message(1, "otra")  # a second later: chat 1 may hear again
            with pytest.raises(RetryAfter) as chat_limit:
                await bot.send_message(1, "y otra")
            await asyncio.sleep(1.05)
            for _ in range(2):
                await bot.send_message(-100, "al grupo")
                await asyncio.sleep(1.05)
            with pytest.raises(RetryAfter) as group_limit:
                await bot.send_message(-100, "una más")  # the 3rd within a minute
        return bot_limit.value, chat_limit.value, group_limit.value

    with FakeBotAPI(limits=Limits(per_bot=3, per_chat=1, per_group_minute=2)) as server:
        refused = asyncio.run(scenario(server))
        waits = [error.retry_after.total_seconds() if isinstance(error.retry_after, dtm.timedelta)
                 else float(error.retry_after) for error in refused]
        assert waits[0] == 1 and waits[1] == 1 and 57 <= waits[2] <= 59
        assert server.floods == 3 and len(server.flood_times) == 3
        assert len(server.sent_messages()) == 3 + 1 + 2  # what was refused never landed


# ------------------------------------------------------------ streamed replies


def test_drafts_in_private_chats_edits_and_deletions_are_recorded(fake):
    async def scenario():
        async with make_bot(fake) as bot:
            assert await bot.send_message_draft(chat_id=42, draft_id=7, text="Hola")
            assert await bot.send_message_draft(chat_id=42, draft_id=7, text="Hola, ya casi")
            with pytest.raises(BadRequest, match="(?i)private chats"):
                await bot.send_message_draft(chat_id=-100, draft_id=7, text="x")
            with pytest.raises(BadRequest, match="(?i)non-zero"):
                await bot.send_message_draft(chat_id=42, draft_id=0, text="x")
            preview = await bot.send_message(chat_id=-100, text="Ho ▍")
            await bot.edit_message_text("Hola", chat_id=-100, message_id=preview.message_id)
            assert await bot.delete_message(chat_id=-100, message_id=preview.message_id)
            with pytest.raises(BadRequest, match="(?i)message to delete not found"):
                await bot.delete_message(chat_id=-100, message_id=preview.message_id)

    asyncio.run(scenario())
    assert fake.drafts(42) == ["Hola, ya casi"]  # one draft id: the latest text
    assert [c.params["text"] for c in fake.calls("sendMessageDraft")][:2] == ["Hola", "Hola, ya casi"]
    assert [m["text"] for m in fake.deleted] == ["Hola"] and fake.sent_messages(chat_id=-100) == []
    assert len(fake.calls("deleteMessage")) == 2


def test_a_draft_can_be_refused_with_429_and_held(fake):
    fake.fail_next("sendMessageDraft", status=429, description="Too Many Requests: retry after 3", retry_after=3)

    async def scenario():
        async with make_bot(fake) as bot:
            with pytest.raises(RetryAfter):
                await bot.send_message_draft(chat_id=42, draft_id=1, text="a")
            with fake.hold("sendMessageDraft") as hold:
                task = asyncio.create_task(bot.send_message_draft(chat_id=42, draft_id=1, text="b"))
                await asyncio.to_thread(hold.wait_held)
                assert not task.done()
            return await task

    assert asyncio.run(scenario()) is True
    assert fake.drafts(42) == ["b"]
