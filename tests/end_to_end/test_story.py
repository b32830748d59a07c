"""A conversation's whole story on one page (/console/conversations/<id>/story/): every
message, window, flush, turn, guard decision, ledger row and audit event in time order,
with links, secrets hidden; readable by auditors, downloadable as JSON, paginated."""

import io
import json
import re
import time
from datetime import UTC, datetime, timedelta
from html import unescape
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.urls import reverse

from audit.models import AuditEvent, EventKind
from conversations import flushing, handoff
from conversations.ingest import Inbound, admit
from conversations.models import (
    BufferState,
    Conversation,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, Outcome
from delivery.transports import SendResult
from tests.support import local_http
from tests.support.e2e import SECRET, TOKEN, UNPACED, send, telegram_channel
from tools import approvals, guard
from tools.models import ActionClaim, ToolPolicy
from tools.registry import Scope

AGENT = {"AGENTLOOP_EXTRA_AGENTS": "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}
CALLS = [{"name": "calendar_create_event",
          "arguments": {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}}]
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
BOT_TOKEN_SHAPE = "987654321:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def story_url(conversation_id, **query):
    url = reverse("console-story", args=[conversation_id])
    return url + ("?" + urlencode(query) if query else "")


def logged_in(client, name, role):
    call_command("createuser", name, "--role", role, "--password", f"pw-{name}-1", stdout=io.StringIO())
    log_in(client, name, f"pw-{name}-1")
    return client


def log_in(client, name, password):
    """Through the admin's login form (django-axes watches it; client.login gives it no request)."""
    response = client.post("/admin/login/", {"username": name, "password": password, "next": "/admin/"})
    assert response.status_code == 302, response.content


def entries_in_html(html):
    """(kind, id) of each entry, in page order."""
    return [(kind, int(pk)) for kind, pk in re.findall(r'<li class="story-entry story-\w+" id="(\w+)-(\d+)"', html)]


def deliver_again(web, body):
    """Telegram's retry of an update we already admitted."""
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                          headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200 and response.json()["duplicate"] is True


@pytest.mark.e2e
def test_the_incident_told_in_time_order_to_an_auditor_with_no_secret(processes, make_channel, fake_telegram,
                                                                      client):
    # Unpaced: the notice it claims by hand below goes into the chat just answered; paced,
    # it waits for the chat's next slot (1 s), and the claim found nothing to take.
    channel = telegram_channel(make_channel, fake_telegram, agent="scripted", agent_config={"tool_calls": CALLS},
                               extra=UNPACED)
    web, _ = processes.web(wait=False), processes.worker(**AGENT)

    first = send(web, "tg", 101, f"Confirmo las horas de psicología (clave {SECRET}).")
    fake_telegram.wait_for("sendMessage", timeout=15)
    deliver_again(web, first)  # refused by the inbound dedup
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    processes.stop_all()

    conversation = Conversation.objects.get(channel=channel)
    # A proposal an operator applies, and a ledger row whose error carries the bot's URL
    # (written redacted; an older row is planted raw, as rows were before redaction).
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval="operator")
    guard.forget_policies()
    proposal = guard.invoke("calendar_create_event", {"title": "Kine", "start_datetime": "2026-12-02T10:00"},
                            Scope.of_conversation(conversation), actor="worker:test").proposal_id
    approvals.apply(proposal, by="olga")
    row = ledger.enqueue(conversation, "¿sigue ahí?", kind=OutboundKind.NOTICE)
    [claimed] = ledger.claim_many([row.pk], "w1")
    ledger.finish(claimed, "w1", SendResult.failed(Outcome.PERMANENT, "chat not found"))
    OutboundMessage.objects.filter(pk=row.pk).update(
        last_error=f"InvalidURL: {fake_telegram.url}/bot{TOKEN}/sendMessage; also {BOT_TOKEN_SHAPE}")

    auditor = logged_in(client, "audrey", "auditor")
    response = auditor.get(story_url(conversation.pk))
    assert response.status_code == 200
    html = response.content.decode()
    for secret in (TOKEN, SECRET, BOT_TOKEN_SHAPE, BOT_TOKEN_SHAPE.split(":")[1]):
        assert secret not in html and secret not in unescape(html), secret

    data = auditor.get(story_url(conversation.pk, format="json"))
    assert data["Content-Disposition"] == f'attachment; filename="conversation-{conversation.pk}-story.json"'
    for secret in (TOKEN, SECRET, BOT_TOKEN_SHAPE):
        assert secret not in data.content.decode()
    story = json.loads(data.content)
    entries = story["entries"]
    # The page and the download tell the same story, oldest first.
    assert entries_in_html(html) == [(e["kind"], e["id"]) for e in entries]
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)

    messages = list(InboundMessage.objects.filter(conversation=conversation).order_by("received_at"))
    turns = list(Turn.objects.filter(conversation=conversation).order_by("created_at"))
    claims = list(ActionClaim.objects.filter(conversation_id=conversation.pk).order_by("created_at"))
    rows = list(OutboundMessage.objects.filter(conversation=conversation).order_by("created_at"))
    duplicates = list(AuditEvent.objects.filter(conversation_id=conversation.pk, kind=EventKind.DUPLICATE_PREVENTED))
    assert len(messages) == 2 and len(turns) == 2 and len(claims) == 2 and len(rows) == 4 and len(duplicates) == 1
    by_kind = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e)
    assert [e["id"] for e in by_kind["message"]] == [m.pk for m in messages]
    assert [e["id"] for e in by_kind["turn"]] == [t.pk for t in turns]
    assert [e["id"] for e in by_kind["claim"]] == [c.pk for c in claims]
    assert [e["id"] for e in by_kind["ledger"]] == [r.pk for r in rows]
    assert len(by_kind["buffer"]) == 2 and all("flushed" in e["title"] for e in by_kind["buffer"])

    # The story reads as it happened: message, its flush, its turn, the turn's claim, its reply.
    order = [(e["kind"], e["id"]) for e in entries]
    first_turn = turns[0]
    assert (order.index(("message", messages[0].pk)) < order.index(("buffer", first_turn.buffer_id))
            < order.index(("turn", first_turn.pk)) < order.index(("claim", claims[0].pk))
            < order.index(("ledger", rows[0].pk)) < order.index(("message", messages[1].pk))
            < order.index(("audit", duplicates[0].pk)))

    def details(entry):
        return {d["label"]: d["value"] for d in entry["details"]}

    assert "closed, 1.2 s" in details(by_kind["message"][0])["Window"]  # it ends in "."
    assert "•••" in by_kind["message"][0]["text"]
    assert details(by_kind["buffer"][0])["Waited"].endswith("after the last")
    assert "ran " in details(by_kind["turn"][0])["Finished"]
    assert details(by_kind["turn"][0])["Fired an effect"].startswith("yes")
    caught = next(e for e in entries if e["id"] == duplicates[0].pk and e["kind"] == "audit")
    assert caught["title"] == "Audit: Duplicate prevented"
    original = reverse("admin:tools_actionclaim_change", args=[claims[0].pk])
    assert {"label": f"original: claim {claims[0].pk}", "url": original} in caught["links"]
    assert details(by_kind["claim"][1])["Proposal"].startswith("Applied by olga at ")
    assert any(e["title"] == "Audit: Proposal applied" for e in entries)
    planted = details(by_kind["ledger"][-1])
    assert planted["Last outcome"] == "Permanent failure" and "/bot•••/sendMessage" in planted["Last error"]
    assert details(by_kind["ledger"][0])["Attempts"].startswith("1 ")
    assert "duplicate: true" in story["not_recorded"][0]

    # Links: an auditor opens the rows an auditor may read (claims, ledger rows, events);
    # the others are named, not linked.
    assert f'href="{original}"' in html
    assert f'href="{reverse("admin:delivery_outboundmessage_change", args=[rows[0].pk])}"' in html
    assert reverse("admin:conversations_turn_change", args=[turns[0].pk]) not in html
    assert auditor.get(original).status_code == 200


def test_an_operator_sees_every_link(client, make_channel):
    channel = make_channel("chan")
    admit(channel, Inbound(platform_message_id="1", chat_id="7", sender_id="7", text="hola"), now=T0)
    flushing.flush_due(now=T0 + timedelta(seconds=5))
    conversation = Conversation.objects.get()
    turn, buffer, message = Turn.objects.get(), MessageBuffer.objects.get(), InboundMessage.objects.get()
    operator = logged_in(client, "olga", "operator")
    html = operator.get(story_url(conversation.pk)).content.decode()
    for url in (reverse("admin:conversations_turn_change", args=[turn.pk]),
                reverse("admin:conversations_messagebuffer_change", args=[buffer.pk]),
                reverse("admin:conversations_inboundmessage_change", args=[message.pk]),
                reverse("admin:conversations_conversation_change", args=[conversation.pk])):
        assert f'href="{url}"' in html
    assert entries_in_html(html) == [("message", message.pk), ("buffer", buffer.pk), ("turn", turn.pk)]
    # The admin's page of the conversation links here.
    admin_page = operator.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert story_url(conversation.pk) in admin_page.content.decode()


def test_a_rejected_double_text_is_in_the_story(client, make_channel):
    channel = make_channel("chan", double_texting="reject")
    admit(channel, Inbound(platform_message_id="1", chat_id="7", sender_id="7", text="agéndame la cita."), now=T0)
    flushing.flush_due(now=T0 + timedelta(seconds=2))
    Turn.objects.update(state=TurnState.RUNNING, started_at=T0 + timedelta(seconds=2), owner="w1")
    admit(channel, Inbound(platform_message_id="2", chat_id="7", sender_id="7", text="¿y?"), now=T0 + timedelta(seconds=3))
    conversation = Conversation.objects.get()
    data = logged_in(client, "audrey", "auditor").get(story_url(conversation.pk, format="json")).json()
    kinds = [e["kind"] for e in data["entries"]]
    assert kinds == ["message", "buffer", "turn", "message", "ledger", "double_texting"]
    rejected = data["entries"][3]
    assert {"label": "Disposition", "value": "Rejected (a turn was running)"} in rejected["details"]
    assert any(d["label"] == "Double texting" and "arrived while turn" in d["value"] for d in rejected["details"])
    assert data["entries"][5]["title"] == "Audit: Message rejected (turn running)"


@pytest.mark.django_db
def test_anonymous_is_sent_to_login_and_others_are_refused(client, django_user_model, make_channel,
                                                           make_conversation):
    conversation = make_conversation(make_channel("chan"))
    url = story_url(conversation.pk)
    response = client.get(url)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    django_user_model.objects.create_user("sam", password="pw-sam-1", is_staff=True)
    log_in(client, "sam", "pw-sam-1")
    assert client.get(url).status_code == 403
    assert client.get(story_url(conversation.pk, format="json")).status_code == 403
    logged_in(client, "audrey", "auditor")
    assert client.get(url).status_code == 200
    assert client.get(story_url(conversation.pk + 1000)).status_code == 404


# --- 5,000 messages -------------------------------------------------------------------------------


def long_conversation(channel, conversation, messages=5000, per_turn=5):
    """`messages` messages in bursts of `per_turn`, each burst a flushed buffer, a turn,
    a ledger row and an audit event (written in bulk: the shape matters here, not the path)."""
    bursts = messages // per_turn
    buffers = MessageBuffer.objects.bulk_create([MessageBuffer(
        conversation=conversation, state=BufferState.FLUSHED, first_message_at=T0 + timedelta(minutes=b),
        last_message_at=T0 + timedelta(minutes=b, seconds=per_turn - 1),
        flush_at=T0 + timedelta(minutes=b, seconds=per_turn + 1), window_kind="closed", window_seconds=1.2,
        message_count=per_turn, flush_reason=FlushReason.WINDOW,
        flushed_at=T0 + timedelta(minutes=b, seconds=per_turn + 1)) for b in range(bursts)])
    buffers = list(MessageBuffer.objects.filter(conversation=conversation).order_by("first_message_at"))
    InboundMessage.objects.bulk_create([InboundMessage(
        channel=channel, conversation=conversation, platform_message_id=f"{b}-{i}", buffer=buffers[b],
        text=f"mensaje {i} de la ráfaga {b}.", received_at=T0 + timedelta(minutes=b, seconds=i))
        for b in range(bursts) for i in range(per_turn)], batch_size=500)
    Turn.objects.bulk_create([Turn(
        conversation=conversation, buffer=buffers[b], merged_input="…", flush_reason=FlushReason.WINDOW,
        state=TurnState.DONE, created_at=T0 + timedelta(minutes=b, seconds=per_turn + 1),
        started_at=T0 + timedelta(minutes=b, seconds=per_turn + 1.1),
        finished_at=T0 + timedelta(minutes=b, seconds=per_turn + 2), reply_text="ok") for b in range(bursts)])
    OutboundMessage.objects.bulk_create([OutboundMessage(
        conversation=conversation, channel=channel, chat_id=conversation.chat_id, text="ok", state="delivered",
        attempts=1, created_at=T0 + timedelta(minutes=b, seconds=per_turn + 2),
        delivered_at=T0 + timedelta(minutes=b, seconds=per_turn + 2.2)) for b in range(bursts)])
    AuditEvent.objects.bulk_create([AuditEvent(
        kind=EventKind.CONTROL_COMMAND, conversation_id=conversation.pk, channel_slug=channel.slug,
        at=T0 + timedelta(minutes=b, seconds=30), summary="/help") for b in range(bursts)])
    return messages + 4 * bursts


@pytest.mark.django_db
def test_five_thousand_messages_page_by_page_within_a_bounded_number_of_queries(
        client, make_channel, make_conversation, django_assert_max_num_queries, capsys):
    channel = make_channel("chan")
    conversation = make_conversation(channel)
    total = long_conversation(channel, conversation)
    client = logged_in(client, "audrey", "auditor")

    seen, cursor, pages, timings = [], None, 0, []
    while True:
        # session, user, its permissions (2), the conversation, one query per source (9: reactions the
        # latest), and
        # at most every 30 s the secrets for redaction: the channels' and the MCP servers'
        # (3 each with their savepoints)
        with django_assert_max_num_queries(20):
            started = time.perf_counter()
            response = client.get(story_url(conversation.pk, **({"before": cursor} if cursor else {}),
                                            format="json"))
            timings.append(time.perf_counter() - started)
        data = response.json()
        assert len(data["entries"]) <= 200
        seen = data["entries"] + seen
        pages += 1
        cursor = data["earlier"]
        if cursor is None:
            break
    assert len(seen) == total and pages == -(-total // 200)
    assert len({(e["kind"], e["id"]) for e in seen}) == total  # none twice, none lost across pages
    assert [e["at"] for e in seen] == sorted(e["at"] for e in seen)

    started = time.perf_counter()
    with django_assert_max_num_queries(21):  # the JSON's 20, and the header's running turn
        html = client.get(story_url(conversation.pk)).content.decode()
    html_seconds = time.perf_counter() - started
    assert len(entries_in_html(html)) == 200 and "Load earlier" in html
    with capsys.disabled():
        print(f"\nstory of {InboundMessage.objects.count()} messages ({total} entries): newest HTML page "
              f"{html_seconds * 1000:.0f} ms; JSON pages median {sorted(timings)[len(timings) // 2] * 1000:.0f} ms, "
              f"max {max(timings) * 1000:.0f} ms over {pages} pages")


@pytest.mark.e2e
def test_the_dashboard_links_to_the_story_in_a_browser(processes, browser, make_channel, fake_telegram):
    """An auditor watching the dashboard follows a message's "story" link to the page
    (the README's screenshot)."""
    from tests.support.browser import assert_no_console_errors, page_for, screenshot

    telegram_channel(make_channel, fake_telegram, agent="scripted", agent_config={"tool_calls": CALLS})
    call_command("createuser", "audrey", "--role", "auditor", "--password", "pw-audrey-story-1",
                 stdout=io.StringIO())
    web, _ = processes.web(wait=False), processes.worker(**AGENT)
    page = page_for(browser, web.url, "audrey", "pw-audrey-story-1")
    page.goto("/console/")
    page.wait_for_selector("#connection.pill-ok")

    first = send(web, "tg", 101, "Confirmo las horas de psicología.")
    fake_telegram.wait_for("sendMessage", timeout=15)
    deliver_again(web, first)
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)

    page.locator("#feed li", has_text="Duplicate prevented").wait_for()
    page.locator("#feed li", has_text="Confirmo las horas").locator("a.story-link").click()
    page.wait_for_url("**/console/conversations/*/story/")
    page.locator(".story-entry.story-audit", has_text="Duplicate prevented").wait_for()
    kinds = page.locator(".story-entry").evaluate_all("nodes => nodes.map(n => n.dataset.kind)")
    assert {"message", "buffer", "turn", "claim", "ledger", "audit"} <= set(kinds)
    assert TOKEN not in page.content() and SECRET not in page.content()
    page.set_viewport_size({"width": 1280, "height": 1400})
    screenshot(page, "story")
    assert_no_console_errors(page)


# --- a timeline, and people labelled as people (issue 53) ----------------------------------------


def person_and_control_command(channel):
    """A message, a /help, a turn, then olga takes over and answers herself."""
    admit(channel, Inbound(platform_message_id="1", chat_id="7", sender_id="7", sender_name="Ana", text="hola"), now=T0)
    admit(channel, Inbound(platform_message_id="2", chat_id="7", sender_id="7", sender_name="Ana", text="/help"),
          now=T0 + timedelta(seconds=1.2))
    flushing.flush_due(now=T0 + timedelta(seconds=5))
    conversation = Conversation.objects.get()
    handoff.take_over(conversation.pk, "console:olga", now=T0 + timedelta(seconds=8))
    handoff.reply(conversation.pk, "Soy Olga, te ayudo yo.", "console:olga", now=T0 + timedelta(seconds=9))
    return conversation


def test_the_story_reads_as_a_timeline_with_the_person_named(client, make_channel, settings):
    settings.TIME_ZONE = "America/Santiago"  # the page shows the server's TIME_ZONE: 12:00 UTC is 09:00 there
    conversation = person_and_control_command(make_channel("chan"))
    html = logged_in(client, "olga", "operator").get(story_url(conversation.pk)).content.decode()

    # Local times to the second, the date once per day, the gap between steps.
    assert re.search(r'<time datetime="2026-11-29T12:00:00[^"]*">09:00:00</time>', html)
    summaries = re.findall(r"<summary>(.*?)</summary>", html, flags=re.S)
    assert summaries and not any(re.search(r"\d\d:\d\d:\d\d\.\d", re.sub(r"<[^>]+>", "", s))
                                for s in summaries)
    # The audit of the takeover is stamped by the clock, today: one date heading per day.
    days = re.findall(r'<li class="story-day"[^>]*><h2>([^<]+)</h2>', html)
    assert days[0] == "Nov. 29, 2026" and len(days) == len(set(days))
    assert re.search(r'class="story-gap"[^>]*>\+1\.2 s<', html)
    # Each entry collapsed, with its one-line summary; the kinds to filter by.
    assert len(re.findall(r"<details class=\"story-body\">", html)) == len(entries_in_html(html))
    assert "<details class=\"story-body\" open" not in html
    for group in ("messages", "turns", "guard", "replies", "notes", "audit"):
        assert f'data-filter="{group}"' in html
    # /help is a control command, not "Buffered".
    assert "Control command /help from Ana" in html
    # The person's reply carries her name, not "Agent" nor "console:olga".
    assert "Reply by olga" in html and "Held by olga" in html
    assert "console:olga" not in re.sub(r"<details class=\"story-about\">.*?</details>", "", html, flags=re.S) \
        .split('<ol class="story"')[0]
    # The controls at the top, in the sticky header; the notes for developers collapsed at the end.
    head, _, rest = html.partition('<ol class="story"')
    assert 'id="hold"' in head and 'class="story-header"' in head and 'value="give_back"' in head
    assert '<details class="story-about">' in rest and "duplicate: true" in rest


def test_the_person_reply_in_the_json_and_the_playground_transcript(client, make_channel):
    conversation = person_and_control_command(make_channel("chan"))
    data = logged_in(client, "olga", "operator").get(story_url(conversation.pk, format="json")).json()
    turn = [e for e in data["entries"] if e["kind"] == "turn"][-1]
    assert turn["title"] == "Reply by olga" and turn["by"] == "olga"
    assert data["conversation"]["held_by"] == "console:olga" and data["conversation"]["holder"] == "olga"
    from delivery.console import replies_of
    # The playground's transcript: /help's answer is agentloop's, the last reply olga's.
    assert [r.get("by") for r in replies_of(conversation.pk)] == [None, "olga"]
