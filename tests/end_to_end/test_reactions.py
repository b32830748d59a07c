"""Reactions (issue 56 §2), through the fake Bot API, the real web server and worker:
a reaction on the bot's message is a note in the agent's next turn (once, however often
Telegram delivers it); a 👍/👎 on a confirmation question is the tap it stands for,
applied once; a channel's status reaction (👀, then 👌) on the person's message while
it is answered, best effort — a reaction API that hangs never holds the reply."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conversations.models import ContextNote, InboundReaction, ReactionOutcome, Turn
from delivery.models import OutboundMessage
from tests.conftest import wait_until
from tests.end_to_end.test_user_confirmation import (
    CHAT,
    FAST,
    button,
    deliver_questions,
    propose,
    question_on,
    shown,
    tap_over_http,
    telegram_conversation,
    user_policy,
)
from tests.fakes.telegram_api import BotAPIError
from tests.support import e2e
from tools.models import CalendarEvent, Proposal, ProposalState


def bot_messages(fake, chat=CHAT):
    return fake.sent_messages(e2e.TOKEN, chat)


def the_recorded_reply(fake):
    """The bot's one reply, once its ledger row holds the message's id: the fake has the
    message as soon as Telegram answers, the row a moment later, and a reaction is
    matched through the row (a reaction before it is 'ignored', as it would be live)."""
    wait_until(lambda: bot_messages(fake), timeout=30, message="the reply")
    [reply] = bot_messages(fake)
    wait_until(lambda: OutboundMessage.objects.filter(platform_message_id=str(reply["message_id"])).exists(),
               timeout=10, message="the reply's id recorded")
    return reply


# --- a reaction on the bot's reply: a note in the next turn -------------------------------------


def test_a_reaction_on_the_bots_reply_reaches_the_next_turn_once(processes, make_channel, fake_telegram):
    from tests.end_to_end.test_openai_agent_e2e import KEY_ENV
    from tests.fakes.openai_api import FakeOpenAI, Reply

    with FakeOpenAI() as fake_openai:
        e2e.telegram_channel(make_channel, fake_telegram, agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"}, **FAST)
        fake_openai.script(Reply("Tu hora es el martes a las 10."), Reply("¡De nada!"))
        web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
        e2e.send(web, "tg", CHAT, "¿A qué hora es mi cita?")
        reply = the_recorded_reply(fake_telegram)
        reaction = fake_telegram.message_reaction(e2e.TOKEN, CHAT, reply["message_id"], "👍")
        assert tap_over_http(web, reaction) == {"ok": True, "reaction": "noted", "duplicate": False}
        assert tap_over_http(web, reaction)["duplicate"] is True  # Telegram delivers it again
        assert Turn.objects.count() == 1  # a reaction is no turn
        e2e.send(web, "tg", CHAT, "Gracias.")
        wait_until(lambda: len(bot_messages(fake_telegram)) == 2, timeout=30, message="the second reply")
        requests = fake_openai.requests()
    notes = [m["content"] for m in requests[1].messages if m["role"] == "system" and "reacted" in m["content"]]
    assert len(notes) == 1 and "👍" in notes[0] and "Tu hora es el martes" in notes[0]
    assert ContextNote.objects.count() == 1
    reaction = InboundReaction.objects.get()
    assert reaction.outcome == ReactionOutcome.NOTED
    # The story page shows it, beside the note it left.
    from agentloop.console import story

    page = story.page(reaction.conversation_id)
    [entry] = [e for e in page.entries if e.kind == "reaction"]
    assert entry.title == "Reaction 👍 on the bot's message: Noted for the agent's next turn"
    assert any(e.kind == "note" for e in page.entries)


def test_a_reaction_through_long_polling_is_asked_for(processes, make_channel, fake_telegram):
    """Telegram sends message_reaction only to a bot that names it in allowed_updates
    (the fake holds it back otherwise)."""
    e2e.telegram_channel(make_channel, fake_telegram, mode="polling", **FAST)
    processes.worker()
    fake_telegram.push_message(e2e.TOKEN, CHAT, "hola.")
    reply = the_recorded_reply(fake_telegram)
    fake_telegram.push_update(e2e.TOKEN, fake_telegram.message_reaction(e2e.TOKEN, CHAT, reply["message_id"], "🔥"))
    wait_until(lambda: ContextNote.objects.exists(), timeout=30, message="the note")
    assert "🔥" in ContextNote.objects.get().text and Turn.objects.count() == 1
    polled = [c.params.get("allowed_updates") for c in fake_telegram.calls("getUpdates")]
    assert all("message_reaction" in allowed for allowed in polled)


# --- a 👍 or 👎 on a confirmation question ----------------------------------------------------------


def test_a_thumbs_up_on_a_question_confirms_once_with_repeats_and_a_racing_tap(processes, make_channel,
                                                                              fake_telegram):
    channel = e2e.telegram_channel(make_channel, fake_telegram)
    user_policy()
    propose(telegram_conversation(channel))
    deliver_questions()
    [question] = question_on(fake_telegram)
    webs = [processes.web(), processes.web()]
    # 👍 (Telegram's update, and its redelivery), 👍 again after taking it back, a 👍 with a
    # skin tone, and two taps on Yes: all at once, on two web processes.
    thumbs = [fake_telegram.message_reaction(e2e.TOKEN, CHAT, question["message_id"], emoji)
              for emoji in ("👍", "👍", "👍🏽")]
    updates = [*thumbs, thumbs[0], *(fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y"))
                                     for _ in range(2))]
    barrier = threading.Barrier(len(updates))

    def deliver(i):
        barrier.wait()
        return tap_over_http(webs[i % 2], updates[i])

    with ThreadPoolExecutor(len(updates)) as pool:
        answers = list(pool.map(deliver, range(len(updates))))
    assert CalendarEvent.objects.count() == 1 and Proposal.objects.get().state == ProposalState.APPLIED
    won = [a for a in answers if (a.get("reaction") == "confirmed" and not a["duplicate"])
           or a.get("callback") == "confirmed"]
    assert len(won) == 1, answers
    assert sum(a.get("duplicate") is True for a in answers) == 1  # the redelivered update
    assert InboundReaction.objects.count() == 3
    # Edited by the winner and by the taps that lost (which may see it still applying).
    wait_until(lambda: "Confirmed at" in shown(fake_telegram, question)["text"], timeout=10,
               message="the question shows the outcome")


def test_a_thumbs_down_declines_and_only_the_persons_own_counts(processes, make_channel, fake_telegram):
    channel = e2e.telegram_channel(make_channel, fake_telegram)
    user_policy()
    group = -100777
    propose(telegram_conversation(channel, sender=CHAT, chat=group, group=True))
    deliver_questions()
    [question] = question_on(fake_telegram, chat=group)
    web = processes.web()
    someone = fake_telegram.message_reaction(e2e.TOKEN, group, question["message_id"], "👍", user_id=5150)
    assert tap_over_http(web, someone)["reaction"] == "not_yours"
    assert Proposal.objects.get().state == ProposalState.PENDING
    down = fake_telegram.message_reaction(e2e.TOKEN, group, question["message_id"], "👎", user_id=CHAT)
    assert tap_over_http(web, down)["reaction"] == "rejected"
    up = fake_telegram.message_reaction(e2e.TOKEN, group, question["message_id"], "👍", old=("👎",), user_id=CHAT)
    assert tap_over_http(web, up)["reaction"] == "already"
    assert Proposal.objects.get().state == ProposalState.REJECTED and not CalendarEvent.objects.exists()
    assert "❌ Declined at" in shown(fake_telegram, question, chat=group)["text"]


# --- the status reaction on the person's message ----------------------------------------------------


def test_the_status_reaction_shows_while_the_window_runs_then_is_replaced(processes, make_channel, fake_telegram):
    e2e.telegram_channel(make_channel, fake_telegram, status_reaction="seen_done", typing_mode="never",
                         window_closed=2.0, window_neutral=2.0, window_greeting=2.0, window_open=2.0)
    web, _ = processes.web(wait=False), processes.worker()
    message_id = e2e.send(web, "tg", CHAT, "hola, una consulta")["message"]["message_id"]
    key = (e2e.TOKEN, CHAT, message_id)
    wait_until(lambda: fake_telegram.reactions.get(key) == ["👀"], timeout=30, message="👀 on the message")
    assert not bot_messages(fake_telegram) and not Turn.objects.exists()  # the window is still open
    wait_until(lambda: bot_messages(fake_telegram), timeout=30, message="the reply")
    wait_until(lambda: fake_telegram.reactions.get(key) == ["👌"], timeout=30, message="👌 once answered")
    assert [c.params["reaction"] for c in fake_telegram.calls("setMessageReaction")] == [
        [{"type": "emoji", "emoji": "👀"}], [{"type": "emoji", "emoji": "👌"}]]


def test_a_hanging_or_failing_reaction_api_never_holds_the_reply(processes, make_channel, fake_telegram):
    released = threading.Event()

    def hangs(token, params):
        released.wait(30)  # the reaction call never answers while the reply goes
        raise BotAPIError(500, "Internal Server Error")

    fake_telegram.set_handler("setMessageReaction", hangs)
    e2e.telegram_channel(make_channel, fake_telegram, status_reaction="seen", **FAST)
    web, _ = processes.web(wait=False), processes.worker()
    try:
        e2e.send(web, "tg", CHAT, "¿qué horas tengo?")
        wait_until(lambda: fake_telegram.calls("setMessageReaction"), timeout=30, message="the 👀 call made")
        wait_until(lambda: bot_messages(fake_telegram), timeout=30, message="the reply, the call still hanging")
        assert not released.is_set()
    finally:
        released.set()
    assert bot_messages(fake_telegram)[0]["text"] == "¿qué horas tengo?"


def test_an_unpaced_channel_held_back_by_a_429_puts_no_reaction_on_in_the_meantime(processes, make_channel,
                                                                                    fake_telegram):
    """An unpaced channel books no bot slots, but a 429's pause (its flood key, 8 s here:
    more than 2 s left when the window opens, on a loaded machine too) holds its reactions
    as it holds its replies: 👀 is skipped, not sent into the penalty."""
    from delivery import pacing

    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED, status_reaction="seen",
                                   typing_mode="never", **FAST)
    web, _ = processes.web(wait=False), processes.worker()
    pacing.pause(pacing.flood_key(channel.pk), 8.0)
    e2e.send(web, "tg", CHAT, "hola, una consulta")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=30)
    assert [call for call in fake_telegram.calls("setMessageReaction") if call.at < reply.at] == []
    assert reply.params["text"] == "hola, una consulta"


def test_the_fake_refuses_what_telegram_refuses(fake_telegram):
    """setMessageReaction's limits, as the Bot API answers them (the transport's 👌, not ✅)."""
    import asyncio

    import telegram
    from telegram.error import BadRequest

    async def react(reaction):
        async with telegram.Bot(e2e.TOKEN, base_url=f"{fake_telegram.url}/bot") as bot:
            return await bot.set_message_reaction(chat_id=CHAT, message_id=3, reaction=reaction)

    assert asyncio.run(react([telegram.ReactionTypeEmoji("👌")])) is True
    for reaction, error in [([telegram.ReactionTypeEmoji("✅")], "REACTION_INVALID"),
                            ([telegram.ReactionTypeEmoji("👀"), telegram.ReactionTypeEmoji("👍")],
                             "REACTIONS_TOO_MANY")]:
        with pytest.raises(BadRequest, match=f"(?i){error}"):
            asyncio.run(react(reaction))
    assert fake_telegram.reactions[(e2e.TOKEN, CHAT, 3)] == ["👌"]
    assert json.loads(json.dumps(fake_telegram.message_reaction(e2e.TOKEN, CHAT, 3, "")))["message_reaction"][
        "new_reaction"] == []


# --- Slack: reaction_added (Events API, reactions:read), reactions.add / reactions.remove -----------


def test_slack_a_reaction_on_the_apps_reply_is_noted_once_and_the_status_reaction_follows(processes, make_channel):
    from delivery.models import OutboundMessage
    from tests.end_to_end.test_slack_e2e import started_worker
    from tests.fakes import slack_api
    from tests.fakes.slack_api import FakeSlackAPI
    from tests.support import slack

    with FakeSlackAPI(tokens=[slack.TOKEN]) as fake:
        slack.slack_channel(make_channel, fake, status_reaction="seen_done", window_closed=1.0,
                            agent_config={"delay": 1.0})
        web, _ = processes.web(), started_worker(processes)
        event = slack.send(web, "¿Qué horas tengo?")
        wait_until(lambda: fake.reactions_on(slack.DM, event["ts"]) == {"eyes"}, timeout=30, message="👀")
        reply = wait_until(lambda: OutboundMessage.objects.exclude(platform_message_id="").first(), timeout=30,
                           message="the reply delivered")
        [reply_ts] = fake.messages(slack.DM)
        assert reply.platform_message_id == reply_ts
        wait_until(lambda: fake.reactions_on(slack.DM, event["ts"]) == {"white_check_mark"}, timeout=30,
                   message="✅ once answered")
        # The person's 👍 on the app's reply, and Slack's retry of the same event.
        thumbs = slack_api.envelope(slack_api.reaction_event(slack.USER, "+1", slack.DM, reply_ts))
        assert slack.deliver(web, thumbs)["reaction"] == "noted"
        assert slack.deliver(web, thumbs)["duplicate"] is True
        # A reaction on someone else's message is not ours.
        other = slack_api.reaction_event(slack.USER, "heart", slack.DM, event["ts"], item_user=slack.USER)
        assert slack.deliver(web, slack_api.envelope(other))["ignored"] == ["reaction:not_ours"]
    [note] = ContextNote.objects.all()
    assert ":+1:" in note.text and "¿Qué horas tengo?" in note.text
    assert Turn.objects.count() == 1


# --- WhatsApp: `reaction` messages both ways -----------------------------------------------------------


def test_whatsapp_reactions_both_ways(processes, make_channel):
    from delivery.models import OutboundMessage
    from tests.end_to_end.test_whatsapp_e2e import started_worker
    from tests.fakes import graph_api
    from tests.fakes.graph_api import FakeGraphAPI
    from tests.support import whatsapp

    with FakeGraphAPI(tokens=[whatsapp.TOKEN], phone_number_ids=[whatsapp.PHONE]) as fake:
        whatsapp.whatsapp_channel(make_channel, fake, status_reaction="seen", window_closed=1.0,
                                  agent_config={"delay": 1.0})
        web, _ = processes.web(), started_worker(processes)
        wamid = whatsapp.send(web, "¿Qué horas tengo?")
        wait_until(lambda: fake.reaction_on(whatsapp.USER, wamid) == "👀", timeout=30, message="👀")
        wait_until(lambda: fake.texts(whatsapp.USER), timeout=30, message="the reply")
        wait_until(lambda: fake.reaction_on(whatsapp.USER, wamid) == "", timeout=30, message="👀 taken away")
        reply = wait_until(lambda: OutboundMessage.objects.exclude(platform_message_id="").first(), timeout=10,
                           message="the reply's wamid")
        thumbs = graph_api.reaction_message(whatsapp.USER, reply.platform_message_id, "👍")
        body = graph_api.webhook_body(whatsapp.PHONE, messages=[thumbs])
        assert whatsapp.deliver(web, body)["reactions"] == 1
        assert whatsapp.deliver(web, body)["reactions"] == 0  # Meta's redelivery: the same note
    [note] = ContextNote.objects.all()
    assert "👍" in note.text and Turn.objects.count() == 1
