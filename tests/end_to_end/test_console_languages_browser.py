"""The console's scripts in the reader's language, people named as people, and layouts that
hold (issue 53), in Chromium against the product's real processes: the dashboard and the
playground in Spanish at a phone's width and a desktop's, with a 10,000-character text in
the data. Screenshots (var/screenshots, or AGENTLOOP_SCREENSHOTS_DIR):
dashboard-{phone,desktop}-es.png, playground-person-phone-es.png."""

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations import handoff
from conversations.models import Channel, Conversation, ConversationState
from tests.end_to_end.test_console_browser import PHONE, WINDOWS, live, no_horizontal_scroll, operator
from tests.support import local_http
from tests.support.browser import assert_no_console_errors, off_loop, page_for, screenshot

pytestmark = pytest.mark.e2e
DESKTOP = {"width": 1440, "height": 1000}
LONG = ("Necesito reagendar todas mis horas " * 300)[:10_000]


def in_spanish(page):
    page.context.set_extra_http_headers({"Accept-Language": "es"})
    return page


def proposal_expiring_in_a_day(channel, make_conversation):
    """An email waiting for a person, its body 10,000 characters, expiring in 1,440 minutes."""
    from tools.models import ActionClaim, ClaimState, Proposal

    later = timezone.now() + timedelta(days=1, seconds=30)
    claim = ActionClaim.objects.create(
        scope="contact:1", action="email_send", fingerprint="f" * 64, state=ClaimState.PROPOSED, expires_at=later,
        lease_until=later, conversation_id=make_conversation(channel, "bea").pk, channel_slug=channel.slug,
        arguments={"to": "bea@example.com", "body": LONG})
    return Proposal.objects.create(claim=claim, expires_at=later)


def test_the_dashboard_speaks_spanish_and_names_the_person_who_took_over(processes, browser, agent_key,
                                                                           make_conversation):
    channel = Channel.objects.create(slug="shop", kind="api", agent="echo", **WINDOWS)
    key = agent_key(channel)
    proposal_expiring_in_a_day(channel, make_conversation)
    web = processes.web(wait=False)
    page = in_spanish(page_for(browser, web.url, *operator(), viewport=PHONE))
    page.goto("/console/")
    live(page)

    # The scripts' texts in Spanish (djangojs), the expiry in the reader's words (Intl).
    assert page.locator("#connection").inner_text() == "en vivo"
    card = page.locator("#proposals li", has_text="email_send")
    card.wait_for()
    assert "expira en 1 día" in card.inner_text()
    assert [b.inner_text() for b in card.locator("button").all()] == ["Aplicar", "Rechazar"]
    # The 10,000-character argument: its start, the whole text one click away, no sideways scroll.
    long_body = card.locator("details.long-text")
    assert long_body.get_attribute("open") is None and len(long_body.locator("summary").inner_text()) < 200
    assert no_horizontal_scroll(page)
    long_body.locator("summary").click()
    assert long_body.locator("div").inner_text() == LONG
    assert no_horizontal_scroll(page), "the opened 10,000-character argument scrolls sideways"

    # A message arrives; its chip takes the conversation over; the feed names the person.
    def post(message_id, text):
        response = local_http.post(f"{web.url}/api/v1/channels/shop/messages", headers={"Authorization": f"Bearer {key}"},
                                   json={"message_id": message_id, "contact": "ana", "text": text})
        assert response.status_code == 202, response.text

    post("m1", LONG)
    message = page.locator("#feed li", has_text="ana @ shop")
    message.wait_for()
    assert "en espera, ventana de 3" in message.inner_text()
    assert no_horizontal_scroll(page), "a long message in the feed scrolls sideways"
    message.get_by_role("button", name="Tomar el control").click()
    page.locator("#feed li", has_text="op tomó la conversación").wait_for()
    assert Conversation.objects.get(contact__platform_id="ana").state == ConversationState.PERSON
    assert message.get_by_role("button", name="Devolver").is_visible()  # its chip offers the way back
    post("m2", "¿hola?")
    held = page.locator("#feed li", has_text="¿hola?")
    held.wait_for()
    assert "atendida por op" in held.inner_text()
    assert held.get_by_role("button", name="Devolver").is_visible()
    assert "console:" not in page.locator("#feed").inner_text()
    assert no_horizontal_scroll(page)
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "dashboard-phone-es")
    assert_no_console_errors(page)

    desktop = in_spanish(page.context.browser.new_context(base_url=web.url, viewport=DESKTOP,
                                                          storage_state=page.context.storage_state()).new_page())
    desktop.goto("/console/")
    live(desktop)
    desktop.locator("#feed li", has_text="op tomó la conversación").wait_for()
    assert no_horizontal_scroll(desktop)
    screenshot(desktop, "dashboard-desktop-es")


def test_a_persons_reply_is_named_in_the_playground_at_once(processes, browser):
    """A person's reply pushed live is shown under the person's name at once, not only
    after a reload; a 10,000-character reply wraps at a phone's width."""
    Channel.objects.create(slug="playground", kind="webchat", agent="demo")
    web = processes.web(wait=False)
    processes.worker()
    page = in_spanish(page_for(browser, web.url, *operator(), viewport=PHONE))
    page.goto("/console/playground/")
    live(page)
    page.locator("#conversation-link a", has_text="conversación").wait_for()
    conversation = Conversation.objects.get(channel__slug="playground")

    # A reconnect's transcript would name her too (it redraws the log): this mark shows none happened.
    page.evaluate("document.getElementById('chat-log').append(Object.assign(document.createElement('li'), {id: 'mark'}))")
    off_loop(handoff.take_over, conversation.pk, "console:olga")
    off_loop(handoff.reply, conversation.pk, LONG, "console:olga")
    reply = page.locator(".bubble-person", has_text="Necesito reagendar")
    reply.wait_for(timeout=10_000)
    assert reply.locator(".bubble-by").inner_text() == "olga"
    assert page.locator("#chat-log #mark").count() == 1, "named only after the socket reconnected"
    assert no_horizontal_scroll(page), "a 10,000-character reply scrolls sideways"
    screenshot(page, "playground-person-phone-es")
    assert_no_console_errors(page)

    page.reload()  # the transcript names her too
    live(page)
    assert page.locator(".bubble-person .bubble-by").inner_text() == "olga"
