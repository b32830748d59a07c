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

from conversations import flushing
from conversations.ingest import Inbound, admit
from conversations.models import Turn
from conversations.worker.typing import Typing
from delivery import transports


def a_turn(make_channel, fake_telegram, token, chat):
    """One message's turn on a Telegram channel whose Bot API is the local fake."""
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": token, "api_base": fake_telegram.url})
    admit(channel, Inbound(platform_message_id="1", chat_id=chat, sender_id=chat, text="hola", reply_target="1"))
    flushing.flush_due(timezone.now() + timedelta(minutes=1))
    return Turn.objects.select_related("conversation__channel").get()


def test_a_released_typing_loop_leaves_no_cycle_behind(make_channel, fake_telegram, transactional_db):
    turn = a_turn(make_channel, fake_telegram, "77:TYPING", "501")

    async def show_then_release():
        typing = Typing(worker=None, interval=30)
        typing.turn_started(turn)
        indicator = typing.indicators[turn.conversation_id]
        while indicator.shown_at is None:
            await asyncio.sleep(0.01)  # shown and answered: the loop now sleeps until its next refresh
        task, gone = indicator.task, weakref.ref(indicator)
        typing.turn_ended(turn)
        del indicator
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        del task
        typing.close()
        await transports.close_clients()  # this loop's Bot API client
        return gone

    gc.disable()  # nothing but reference counting frees it
    try:
        gone = asyncio.run(show_then_release())
        assert gone() is None, gc.get_referrers(gone())
    finally:
        gc.enable()


def test_a_release_that_meets_the_answer_still_ends_the_loop(make_channel, fake_telegram, transactional_db):
    """The turn ends in the very turn of the event loop in which the Bot API's answer to
    the typing call completes it. Python 3.11's wait_for then returns the answer and
    drops the cancel (gh-86296): the loop used to carry on and wait for ever for a
    confirmation nothing would give (a task kept per such chat; in the suite, a test
    that hung CI's busy phase). Here the release is made to land exactly there: from the
    typing call's own done callback, queued right after wait_for's."""
    turn = a_turn(make_channel, fake_telegram, "77:RACE", "502")

    async def release_as_answered():
        typing = Typing(worker=None, interval=30)
        typing.turn_started(turn)
        task = typing.indicators[turn.conversation_id].task
        call = None
        while call is None:  # the typing call wait_for runs as a task of its own
            await asyncio.sleep(0)
            call = next((t for t in asyncio.all_tasks() if "send_typing" in t.get_coro().__qualname__), None)
        assert not call.done()
        call.add_done_callback(lambda _: typing.turn_ended(turn))
        try:
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
            return task.cancelled(), dict(typing.indicators)
        finally:
            typing.close()
            await transports.close_clients()

    cancelled, indicators = asyncio.run(release_as_answered())
    assert cancelled and indicators == {}
    assert len(fake_telegram.calls("sendChatAction", token="77:RACE")) == 1
