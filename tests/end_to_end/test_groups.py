"""Groups: the agent answers only what is addressed to it (a mention, a reply to it);
the rest of the group is kept as context for the next turn that is."""

import time

from conversations.models import Disposition, InboundMessage, Turn
from tests.conftest import wait_until
from tests.fakes.telegram_api import BOT_USERNAME
from tests.support import local_http
from tests.support.e2e import SECRET, UNPACED, telegram_channel, update

GROUP = -100777
MENTION = f"@{BOT_USERNAME}"
BOT_ID = 4242  # tests.support.e2e.TOKEN's prefix: the fake's bot user


def group_message(user_id, name, text, *, reply_to_bot=False):
    body = update(GROUP, text, user_id=user_id, first_name=name)
    message = body["message"]
    message["chat"] = {"id": GROUP, "type": "supergroup", "title": "Clínica"}
    if text.startswith(MENTION):
        message["entities"] = [{"type": "mention", "offset": 0, "length": len(MENTION)}]
    if reply_to_bot:
        message["reply_to_message"] = {"message_id": 1, "date": message["date"], "text": "¿Algo más?",
                                       "chat": message["chat"],
                                       "from": {"id": BOT_ID, "is_bot": True, "first_name": "Bot"}}
    return body


def post(web, body):
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def test_five_members_two_mentions_make_two_turns_with_the_group_as_context(processes, make_channel,
                                                                             fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, group_replies="mention")
    web, _ = processes.web(wait=False), processes.worker()
    post(web, group_message(501, "Ana", "hola a todos"))
    post(web, group_message(502, "Beto", "alguien fue ayer"))
    post(web, group_message(503, "Carla", f"{MENTION} ¿a qué hora abren?"))
    fake_telegram.wait_for("sendMessage", timeout=15)
    post(web, group_message(504, "Dani", "yo quiero el martes"))
    post(web, group_message(505, "Eva", f"{MENTION} ¿y los sábados?"))
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    # Every unaddressed burst has been flushed (as context, not as a turn) by now.
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).count() == 3, timeout=15,
               message="three messages kept as context")
    time.sleep(1.0)
    turns = list(Turn.objects.order_by("created_at"))
    assert len(turns) == 2 and len(fake_telegram.calls("sendMessage")) == 2
    carla, eva = turns[0].merged_input, turns[1].merged_input
    assert "Ana: hola a todos" in carla and "Beto: alguien fue ayer" in carla
    assert carla.endswith(f"Carla: {MENTION} ¿a qué hora abren?")
    # The next turn sees what was said since the last one, not again what the first saw.
    assert "Dani: yo quiero el martes" in eva and "Ana:" not in eva and eva.endswith("¿y los sábados?")


def test_a_reply_to_the_bot_counts_and_a_mention_first_carries_the_burst(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, group_replies="mention")
    web, _ = processes.web(wait=False), processes.worker()
    post(web, group_message(501, "Ana", "sí, gracias", reply_to_bot=True))
    post(web, group_message(502, "Beto", f"{MENTION} una consulta,"))
    post(web, group_message(502, "Beto", "para mañana."))
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    time.sleep(1.0)
    by_sender = {t.conversation.sender_id: t.merged_input for t in Turn.objects.select_related("conversation")}
    assert by_sender["502"].endswith(f"Beto: {MENTION} una consulta,\nBeto: para mañana.")
    assert by_sender["501"].endswith("Ana: sí, gracias") and len(by_sender) == 2
    flags = dict(InboundMessage.objects.values_list("text", "mentioned"))
    assert flags == {"sí, gracias": True, f"{MENTION} una consulta,": True, "para mañana.": False}


def test_never_keeps_a_group_as_context_and_answers_nothing(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, group_replies="never")
    web, _ = processes.web(wait=False), processes.worker()
    post(web, group_message(501, "Ana", f"{MENTION} ¿hola?"))
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).exists(), timeout=15,
               message="the message kept as context")
    time.sleep(0.5)
    assert not Turn.objects.exists() and fake_telegram.calls("sendMessage") == []
    assert fake_telegram.calls("sendChatAction") == []  # no "typing…" for what will not be answered


def test_an_unaddressed_burst_shows_no_typing_and_an_addressed_one_does(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, group_replies="mention")
    web, _ = processes.web(wait=False), processes.worker()
    post(web, group_message(501, "Ana", "hola a todos"))  # a greeting: a 4 s window
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).exists(), timeout=15,
               message="the greeting kept as context")
    assert fake_telegram.calls("sendChatAction") == []
    post(web, group_message(502, "Beto", f"{MENTION} hola,"))
    fake_telegram.wait_for("sendChatAction", timeout=5)
    fake_telegram.wait_for("sendMessage", timeout=15)
