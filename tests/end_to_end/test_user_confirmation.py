"""Confirmation by the user, in the chat, exactly once (tools.confirmations).

A tool policy with `approval = user` turns each call into a proposal and a question in
the conversation's chat: Telegram inline buttons (the fake Bot API, driven by
python-telegram-bot as the product drives it) or the web chat's buttons; refused on an
api channel, where the agent that asked could post the "yes". Taps arrive as real callback_query updates on the webhook (the full
Django view, and the lean ASGI path under daphne) and through long polling; each applies
the proposal through the operators' compare-and-swap, once.
"""

import asyncio
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.models import Contact, ContextNote, Conversation
from delivery import ledger
from delivery.models import OutboundMessage
from tests.conftest import wait_until
from tests.support import e2e, local_http
from tools import fingerprint, guard, questions
from tools.guard import Status
from tools.models import ActionClaim, CalendarEvent, ClaimState, Confirmation, Proposal, ProposalState, ToolPolicy
from tools.registry import Scope

EVENT = {"title": "Psicología", "start_datetime": "2026-12-07T10:00"}
CHAT = 4242


# --- helpers ----------------------------------------------------------------------------------


def user_policy(**fields):
    return ToolPolicy.objects.create(name="calendar_create_event", approval="user", **fields)


def telegram_conversation(channel, sender=CHAT, chat=CHAT, name="Ana", group=False):
    person = Contact.objects.create(channel=channel, platform_id=str(sender), display_name=name)
    return Conversation.objects.create(channel=channel, contact=person, chat_id=str(chat), sender_id=str(sender),
                                       is_group=group)


def propose(conversation, arguments=EVENT):
    return guard.invoke("calendar_create_event", arguments, Scope.of_conversation(conversation), actor="worker:w")


def deliver_questions():
    """Send what the ledger holds as the worker does (claim, send through the transport,
    record the outcome). The tests' channels are unpaced (e2e.UNPACED): a paced send that
    wakes late takes a fresh slot on a connection of its own, which would wait for the
    test's transaction holding the claim's slot — a deadlock a loaded machine once hit."""
    from conversations.platforms.telegram.transport import close_bots

    async def send(row):
        try:
            return await ledger.send(row)
        finally:
            await close_bots()

    rows = ledger.claim_due("test-sender")
    for row in rows:
        ledger.finish_many([(row, asyncio.run(send(row)))], "test-sender")
    return rows


def webhook_post(client, update, slug="tg"):
    """The full Django view (the test client does not go through the lean ASGI path)."""
    response = client.post(f"/webhooks/telegram/{slug}/", data=json.dumps(update), content_type="application/json",
                           HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=e2e.SECRET)
    assert response.status_code == 200, response.content
    return response.json()


def question_on(fake, chat=CHAT):
    """The bot's messages in this chat that carry buttons (each question, as sent)."""
    return [m for m in fake.sent_messages(e2e.TOKEN, chat) if "reply_markup" in m]


def button(message, choice):
    [row] = message["reply_markup"]["inline_keyboard"]
    return next(b["callback_data"] for b in row if b["callback_data"].endswith(f":{choice}"))


def toasts(fake):
    return [c.params.get("text") for c in fake.calls("answerCallbackQuery")]


def shown(fake, message, chat=CHAT):
    return fake.sent_message(e2e.TOKEN, chat, message["message_id"])


# --- the question -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_question_says_what_will_happen_and_carries_opaque_buttons(make_channel, fake_telegram, settings):
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "Europe/Madrid"
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    conversation = telegram_conversation(channel)
    outcome = propose(conversation, {**EVENT, "end_datetime": "2026-12-07T11:00"})
    assert outcome.status == Status.AWAITING_APPROVAL and "user's confirmation" in outcome.for_model()["note"]
    again = propose(conversation, {**EVENT, "end_datetime": "2026-12-07T11:00"})
    assert again.duplicate and "awaits the user's own confirmation" in again.note  # not "a person's"
    assert not CalendarEvent.objects.exists()
    deliver_questions()
    [question] = question_on(fake_telegram)
    assert question["text"] == ("Please confirm: create the calendar event “Psicología” on Mon 7 Dec 2026, 10:00 "
                                "until Mon 7 Dec 2026, 11:00.")
    [row] = question["reply_markup"]["inline_keyboard"]
    assert [b["text"] for b in row] == ["✅ Yes, do it", "❌ No"]
    token = Confirmation.objects.get().token
    assert [b["callback_data"] for b in row] == [f"c:{token}:y", f"c:{token}:n"]
    assert all(len(b["callback_data"].encode()) <= 64 for b in row) and len(token) >= 32


# --- Telegram: the full Django view ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_tap_applies_once_and_a_second_tap_or_a_replay_applies_nothing(make_channel, fake_telegram, settings):
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "Europe/Madrid"
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    conversation = telegram_conversation(channel)
    propose(conversation)
    deliver_questions()
    [question] = question_on(fake_telegram)
    client = Client()

    tap = fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y"), first_name="Ana")
    assert webhook_post(client, tap) == {"ok": True, "callback": "confirmed"}
    proposal = Proposal.objects.get()
    assert proposal.state == ProposalState.APPLIED and CalendarEvent.objects.count() == 1
    assert proposal.decided_by == f"user:Ana (telegram {CHAT})"
    at = timezone.localtime(proposal.decided_at, fingerprint.default_zone()).strftime("%H:%M")
    assert toasts(fake_telegram) == ["Done ✅"]
    edited = shown(fake_telegram, question)
    assert "reply_markup" not in edited and edited["text"].endswith(f"✅ Confirmed at {at}: done.")

    again = fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y"))  # a double tap
    assert webhook_post(client, again)["callback"] == "already_confirmed"
    assert webhook_post(client, tap)["callback"] == "already_confirmed"  # Telegram re-delivers the first
    no = fake_telegram.callback_query(e2e.TOKEN, question, button(question, "n"))  # changing one's mind
    assert webhook_post(client, no)["callback"] == "already_confirmed"
    assert toasts(fake_telegram)[1:] == [f"Already confirmed at {at}."] * 3  # the replay's answer is refused
    assert len(fake_telegram.calls("answerCallbackQuery")) == 4
    assert CalendarEvent.objects.count() == 1 and Proposal.objects.get().state == ProposalState.APPLIED
    assert Confirmation.objects.get().taps == 4

    # Audited like an operator's decision; the agent's next turn reads the outcome.
    [applied] = AuditEvent.objects.filter(kind=EventKind.PROPOSAL_APPLIED)
    assert applied.actor == f"user:Ana (telegram {CHAT})"
    [note] = ContextNote.objects.filter(conversation=conversation)
    assert note.text.startswith("The user confirmed and applied calendar_create_event(")
    # The buttons were edited to show it: no extra "approved" message in the chat.
    assert OutboundMessage.objects.count() == 1


@pytest.mark.django_db
def test_no_rejects_and_a_later_yes_is_told_it_was_declined(make_channel, fake_telegram, settings):
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    conversation = telegram_conversation(channel)
    propose(conversation)
    deliver_questions()
    [question] = question_on(fake_telegram)
    client = Client()
    assert webhook_post(client, fake_telegram.callback_query(e2e.TOKEN, question, button(question, "n")))[
        "callback"] == "rejected"
    assert webhook_post(client, fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y")))[
        "callback"] == "already_rejected"
    proposal = Proposal.objects.get()
    assert proposal.state == ProposalState.REJECTED and proposal.claim.state == ClaimState.RELEASED
    assert not CalendarEvent.objects.exists()
    assert toasts(fake_telegram)[0] == "OK, it will not be done." and toasts(fake_telegram)[1].startswith(
        "Already declined at ")
    assert "❌ Declined at" in shown(fake_telegram, question)["text"]
    assert AuditEvent.objects.get(kind=EventKind.PROPOSAL_REJECTED).actor.startswith("user:Ana")
    assert "The user said no to calendar_create_event" in ContextNote.objects.get(conversation=conversation).text
    # Rejected: the same call later is a new proposal (a new question), not a duplicate.
    assert propose(conversation).status == Status.AWAITING_APPROVAL and Proposal.objects.count() == 2


@pytest.mark.django_db
def test_in_a_group_only_the_sender_can_confirm(make_channel, fake_telegram):
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    group = -1001234
    propose(telegram_conversation(channel, sender=111, chat=group, name="Ana", group=True))
    deliver_questions()
    [question] = question_on(fake_telegram, chat=group)
    client = Client()
    other = fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y"), user_id=222,
                                         first_name="Beto")
    assert webhook_post(client, other)["callback"] == "not_yours"
    assert toasts(fake_telegram) == ["Only Ana can confirm this."]
    assert Proposal.objects.get().state == ProposalState.PENDING and not CalendarEvent.objects.exists()
    assert "reply_markup" in shown(fake_telegram, question, chat=group)  # the buttons stay for Ana
    own = fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y"), user_id=111)
    assert webhook_post(client, own)["callback"] == "confirmed" and CalendarEvent.objects.count() == 1


@pytest.mark.django_db
def test_an_expired_proposal_says_so_and_applies_nothing(make_channel, fake_telegram, settings):
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "America/Santiago"
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy(approval_ttl_seconds=60)
    propose(telegram_conversation(channel))
    deliver_questions()
    [question] = question_on(fake_telegram)
    expired_at = timezone.now() - timedelta(seconds=5)
    Proposal.objects.update(expires_at=expired_at)
    local = timezone.localtime(expired_at, fingerprint.default_zone()).strftime("%H:%M")
    answer = webhook_post(Client(), fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y")))
    assert answer["callback"] == "expired"
    assert toasts(fake_telegram) == [f"This request expired at {local}; nothing was done."]
    assert shown(fake_telegram, question)["text"].endswith(f"⌛ Expired at {local}: not done.")
    assert Proposal.objects.get().state == ProposalState.EXPIRED and not CalendarEvent.objects.exists()
    assert ActionClaim.objects.get().state == ClaimState.RELEASED


@pytest.mark.django_db
def test_a_question_expired_by_the_sweep_loses_its_buttons(make_channel, fake_telegram,
                                                           django_capture_on_commit_callbacks):
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy(approval_ttl_seconds=60)
    conversation = telegram_conversation(channel)
    propose(conversation)
    deliver_questions()
    [question] = question_on(fake_telegram)
    Proposal.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert guard.sweep()["expired"] == 1
    edited = shown(fake_telegram, question)
    assert "reply_markup" not in edited and "⌛ Expired at" in edited["text"]
    # The chat is told in words too, and the agent's next turn learns it.
    assert OutboundMessage.objects.filter(text__startswith="⌛ Not approved in time").count() == 1
    assert "expired" in ContextNote.objects.get(conversation=conversation).text
    answer = webhook_post(Client(), fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y")))
    assert answer["callback"] == "expired" and not CalendarEvent.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("forge", ["random_token", "no_such_format", "other_chat", "other_channel"])
def test_a_forged_callback_applies_nothing(make_channel, fake_telegram, forge):
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    make_channel("tg2", kind="telegram", platform_settings={
        "bot_token": "99:OTHER", "webhook_secret": e2e.SECRET, "api_base": fake_telegram.url})
    user_policy()
    propose(telegram_conversation(channel))
    deliver_questions()
    [question] = question_on(fake_telegram)
    data = {"random_token": "c:" + "A" * 32 + ":y", "no_such_format": "apply proposal 1",
            "other_chat": button(question, "y"), "other_channel": button(question, "y")}[forge]
    message = dict(question)
    slug, token = ("tg2", "99:OTHER") if forge == "other_channel" else ("tg", e2e.TOKEN)
    if forge == "other_chat":
        message["chat"] = {"id": 777, "type": "private"}
    update = fake_telegram.callback_query(token, message, data, user_id=CHAT)
    assert webhook_post(Client(), update, slug=slug)["callback"] == "invalid"
    assert toasts(fake_telegram) == ["This button is no longer valid."]
    assert Proposal.objects.get().state == ProposalState.PENDING and not CalendarEvent.objects.exists()


@pytest.mark.django_db
def test_a_question_decided_before_it_was_sent_goes_without_buttons(make_channel, fake_telegram):
    from tools import approvals

    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    proposal_id = propose(telegram_conversation(channel)).proposal_id
    approvals.apply(proposal_id, by="olga")  # an operator may still decide in the admin
    deliver_questions()
    assert question_on(fake_telegram) == []
    assert CalendarEvent.objects.count() == 1


# --- the api channel: refused --------------------------------------------------------------------


@pytest.fixture
def api_setup(make_channel, agent_key):
    channel = make_channel("shop", kind="api")
    return channel, agent_key(channel, name="owner")


def api_post(client, key, message_id, text):
    response = client.post("/api/v1/channels/shop/messages", content_type="application/json",
                           data={"message_id": message_id, "contact": "ana", "sender_name": "Ana", "text": text},
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 202, response.content
    return response.json()


@pytest.mark.django_db
def test_on_an_api_channel_user_confirmation_is_refused(api_setup, client, django_capture_on_commit_callbacks):
    """An api channel's inbound messages are posted by agent keys, as any contact: the
    "yes" could come from the very agent that asked. `approval = user` is refused there,
    clearly, before anything is claimed; an operator must approve instead."""
    channel, key = api_setup
    user_policy()
    api_post(client, key, "m0", "hola")  # opens the conversation
    conversation = Conversation.objects.get()
    with pytest.raises(guard.UserConfirmationUnavailable, match="approval = operator"):
        propose(conversation)
    response = client.post("/api/v1/tools/calendar_create_event/invoke", content_type="application/json",
                           data={"arguments": EVENT, "conversation": conversation.pk},
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 409 and "approval = operator" in response.json()["error"], response.content
    assert not ActionClaim.objects.exists() and not Proposal.objects.exists() and not Confirmation.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):  # no question can be open: an ordinary message
        assert api_post(client, key, "m1", "yes")["disposition"] == "buffered"
    assert CalendarEvent.objects.count() == 0


@pytest.mark.django_db
def test_a_question_left_open_on_an_api_channel_is_not_answered_by_a_posted_yes(
        api_setup, client, django_capture_on_commit_callbacks):
    """A question opened before this refusal existed waits for an operator (or expires):
    a "yes" posted through the API is an ordinary message."""
    channel, key = api_setup
    api_post(client, key, "m0", "hola")
    conversation = Conversation.objects.get()
    policy = user_policy()
    ToolPolicy.objects.filter(pk=policy.pk).update(approval="operator")
    guard.forget_policies()
    proposal_id = propose(conversation).proposal_id
    questions.ask(Proposal.objects.get(pk=proposal_id), ActionClaim.objects.get())  # as an older version did
    with django_capture_on_commit_callbacks(execute=True):
        assert api_post(client, key, "m1", "yes")["disposition"] == "buffered"
    assert Proposal.objects.get(pk=proposal_id).state == ProposalState.PENDING
    assert CalendarEvent.objects.count() == 0


# --- the web chat ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_web_chat_tap_applies_once_and_every_page_sees_it():
    from conversations.models import Channel
    from tests.support.console_socket import ConsoleSocket

    Channel.objects.create(slug="playground", kind="webchat", agent="demo")
    user_policy()
    user = get_user_model().objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_auditevent", "change_channel", "change_proposal"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    headers = [(b"origin", b"http://localhost"), (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]

    async def run():
        from asgiref.sync import sync_to_async

        phone, laptop = (ConsoleSocket("/ws/console/playground/playground/", headers)
                         for _ in range(2))
        for page in (phone, laptop):
            assert (await page.connect())[0]
            hello = await page.receive_json_from(timeout=5)
        conversation = await sync_to_async(Conversation.objects.get)(pk=hello["conversation"])
        await sync_to_async(propose)(conversation)
        rows = await sync_to_async(ledger.claim_due)("test-sender")
        [row] = rows
        assert (await ledger.send(row)).ok
        question = await until(phone, lambda m: m.get("event", {}).get("kind") == "reply")
        buttons = question["event"]["buttons"]
        assert [b["label"] for b in buttons] == ["✅ Yes, do it", "❌ No"]
        yes = buttons[0]["data"]
        assert await transcript_buttons() == [buttons]  # a page opened (or reloaded) now shows them too
        await phone.send_json_to({"confirm": yes})
        await laptop.send_json_to({"confirm": yes})  # the same tap from a second device
        answers = [await until(page, lambda m: m["type"] == "confirmation") for page in (phone, laptop)]
        assert sorted(a["status"] for a in answers) == ["already_confirmed", "confirmed"]
        decided = await until(laptop, lambda m: m.get("event", {}).get("kind") == "question_decided")
        assert "✅ Confirmed at" in decided["event"]["text"]
        assert await transcript_buttons() == []  # decided: a reloaded page shows the outcome only
        await phone.send_json_to({"confirm": "c:" + "B" * 32 + ":y"})
        assert (await until(phone, lambda m: m["type"] == "confirmation"))["status"] == "invalid"
        for page in (phone, laptop):
            await page.disconnect()

    async def transcript_buttons():
        page = ConsoleSocket("/ws/console/playground/playground/", headers)
        assert (await page.connect())[0]
        hello = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return [item["buttons"] for item in hello["transcript"] if item.get("buttons")]

    async def until(page, predicate, timeout=5.0):
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            message = await page.receive_json_from(timeout=max(0.01, deadline - asyncio.get_running_loop().time()))
            if predicate(message):
                return message

    asyncio.run(run())
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().decided_by == "user:op (webchat console-%d)" % user.pk


# --- real processes: the incident, concurrent taps, long polling ----------------------------------


def tap_over_http(web, update, slug="tg"):
    response = local_http.post(f"{web.url}/webhooks/telegram/{slug}/", json=update,
                          headers={"X-Telegram-Bot-Api-Secret-Token": e2e.SECRET}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


FAST = {"window_closed": 0.2, "window_greeting": 0.2, "window_open": 0.2, "window_neutral": 0.2}


def test_the_incident_with_confirmation_by_the_user_makes_two_events(processes, make_channel, fake_telegram):
    """The seed incident on `approval = user`: the first message proposes the two events
    (two questions), the second asks again (the guard holds the open proposals: no new
    question), each is confirmed by a tap on the webhook under daphne (the lean path), a
    double tap and a replayed callback apply nothing more: 2 events."""
    e2e.telegram_channel(make_channel, fake_telegram, agent="demo", **FAST)
    user_policy()
    web, _ = processes.web(wait=False), processes.worker()
    e2e.send(web, "tg", CHAT, "Confirmo las horas de psicología: lunes y miércoles a las 10")
    wait_until(lambda: len(fake_telegram.calls("sendMessage")) >= 3, timeout=30, message="two questions, one reply")
    questions = question_on(fake_telegram)
    assert len(questions) == 2 and all(q["text"].startswith("Please confirm: create the calendar event “Psicología”")
                                       for q in questions)
    e2e.send(web, "tg", CHAT, "Agéndame las horas en mi calendario")
    wait_until(lambda: len(fake_telegram.calls("sendMessage")) >= 4, timeout=30, message="the second reply")
    assert len(question_on(fake_telegram)) == 2 and Proposal.objects.count() == 2  # no new question

    first_taps = [fake_telegram.callback_query(e2e.TOKEN, q, button(q, "y")) for q in questions]
    assert [tap_over_http(web, t)["callback"] for t in first_taps] == ["confirmed", "confirmed"]
    double = fake_telegram.callback_query(e2e.TOKEN, questions[0], button(questions[0], "y"))
    assert tap_over_http(web, double)["callback"] == "already_confirmed"
    assert tap_over_http(web, first_taps[1])["callback"] == "already_confirmed"  # the callback replayed
    assert CalendarEvent.objects.count() == 2
    assert [p.state for p in Proposal.objects.all()] == [ProposalState.APPLIED] * 2
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_APPLIED, actor__startswith="user:").count() == 2
    assert all("✅ Confirmed at" in shown(fake_telegram, q)["text"] for q in questions)

    # The agent's next turn learns both outcomes, as after an operator's decision.
    e2e.send(web, "tg", CHAT, "gracias")
    wait_until(lambda: len(fake_telegram.calls("sendMessage")) >= 5, timeout=30, message="the third reply")
    assert ContextNote.objects.filter(text__startswith="The user confirmed and applied").count() == 2
    assert CalendarEvent.objects.count() == 2


def test_concurrent_taps_from_parallel_processes_apply_once(processes, make_channel, fake_telegram):
    """Two web processes, 16 taps released together (the same user on two devices, and
    Telegram re-delivering): one apply."""
    channel = e2e.telegram_channel(make_channel, fake_telegram, extra=e2e.UNPACED)
    user_policy()
    propose(telegram_conversation(channel))
    deliver_questions()
    [question] = question_on(fake_telegram)
    webs = [processes.web(), processes.web()]
    taps = [fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y")) for _ in range(12)]
    taps += taps[:4]  # re-deliveries of the same updates, in parallel too
    barrier = threading.Barrier(len(taps))

    def press(i):
        barrier.wait()
        started = time.monotonic()
        answer = tap_over_http(webs[i % 2], taps[i])["callback"]
        return answer, time.monotonic() - started

    with ThreadPoolExecutor(len(taps)) as pool:
        answers, took = zip(*pool.map(press, range(len(taps))))
    answers = list(answers)
    print(f"\n{len(taps)} taps at once on 2 web processes ({connection.vendor}): 1 applied; answered in "
          f"p50 {1000 * statistics.median(took):.0f} ms, max {1000 * max(took):.0f} ms")
    assert answers.count("confirmed") == 1 and answers.count("already_confirmed") == len(taps) - 1, answers
    assert CalendarEvent.objects.count() == 1
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_APPLIED).count() == 1
    assert ActionClaim.objects.get().state == ClaimState.DONE


def test_a_tap_through_long_polling(processes, make_channel, fake_telegram):
    channel = e2e.telegram_channel(make_channel, fake_telegram, mode="polling", **FAST)
    user_policy()
    propose(telegram_conversation(channel))
    processes.worker()
    wait_until(lambda: question_on(fake_telegram), timeout=30, message="the question sent by the worker")
    [question] = question_on(fake_telegram)
    fake_telegram.push_update(e2e.TOKEN, fake_telegram.callback_query(e2e.TOKEN, question, button(question, "y")))
    wait_until(lambda: fake_telegram.calls("editMessageText"), timeout=30, message="the question edited")
    assert toasts(fake_telegram) == ["Done ✅"] and CalendarEvent.objects.count() == 1
    polled = [c.params.get("allowed_updates") for c in fake_telegram.calls("getUpdates")]
    assert all("callback_query" in allowed for allowed in polled)


@pytest.mark.e2e
def test_the_web_chat_shows_the_question_with_buttons_and_a_tap_confirms(processes, browser):
    """The playground in a real browser: the demo agent's create becomes a question with
    buttons; a click confirms it, the buttons give way to the outcome, one event."""
    from django.contrib.auth.models import User

    from conversations.models import Channel
    from tests.support.browser import assert_no_console_errors, page_for, screenshot

    Channel.objects.create(slug="playground", kind="webchat", agent="demo", **FAST)
    user_policy()
    User.objects.create_superuser("op", "op@example.com", "pw-op-confirm-1")
    web = processes.web(wait=False)
    processes.worker()
    page = page_for(browser, web.url, "op", "pw-op-confirm-1")
    page.goto("/console/playground/")
    page.wait_for_selector("#connection.pill-ok")
    chat = page.locator("#chat-input")
    chat.fill("Agéndame psicología el lunes a las 10")
    chat.press("Enter")
    question = page.locator(".bubble-agent", has_text="Please confirm: create the calendar event “Psicología”")
    question.wait_for(timeout=20000)
    screenshot(page, "playground-confirmation")
    question.locator("button", has_text="Yes, do it").click()
    question.locator(".text", has_text="✅ Confirmed at").wait_for(timeout=10000)
    assert question.locator("button").count() == 0
    wait_until(lambda: CalendarEvent.objects.count() == 1, timeout=10, message="the event")
    assert Proposal.objects.get().decided_by.startswith("user:op (webchat console-")
    assert_no_console_errors(page)
