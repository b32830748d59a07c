"""A typing loop the worker lets go of is freed at once, by reference counting alone.

Every new chat's window starts a typing loop, and most loops end cancelled (the reply
went out). A cancelled task keeps its CancelledError, whose traceback holds the loop's
frame, which held the indicator, which held the task: a reference cycle per chat that
only the collector's rare full rounds freed. Under a steady 150 messages/s the SQLite
worker grew from 130 to 325 MB in four minutes with them (tests.bench sustained saw the
same as growth in its second half); without them it levels off near 165 MB."""

import asyncio
import gc
import weakref
from datetime import timedelta

from django.utils import timezone

from conversations import engine, platforms
from conversations.ingest import Inbound, admit
from conversations.models import Turn
from conversations.worker.typing import Typing


def test_a_released_typing_loop_leaves_no_cycle_behind(make_channel, fake_telegram, transactional_db):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "77:TYPING",
                                                                     "api_base": fake_telegram.url})
    admit(channel, Inbound(platform_message_id="1", chat_id="501", sender_id="501", text="hola", reply_target="1"))
    engine.flush_due(timezone.now() + timedelta(minutes=1))
    turn = Turn.objects.select_related("conversation__channel").get()

    async def show_then_release():
        typing = Typing(worker=None, interval=30)
        typing.turn_started(turn)
        indicator = typing.indicators[turn.conversation_id]
        while not fake_telegram.calls("sendChatAction", token="77:TYPING"):
            await asyncio.sleep(0.01)  # shown: the loop now sleeps until its next refresh
        task, gone = indicator.task, weakref.ref(indicator)
        typing.turn_ended(turn)
        del indicator
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        del task
        typing.close()
        await platforms.close_clients()  # this loop's Bot API client
        return gone

    gc.disable()  # nothing but reference counting frees it
    try:
        gone = asyncio.run(show_then_release())
        assert gone() is None, gc.get_referrers(gone())
    finally:
        gc.enable()
