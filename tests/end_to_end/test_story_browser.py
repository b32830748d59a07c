"""The story page in Chromium (issue 53): a timeline that holds at a phone's width and a
desktop's with a 10,000-character message, entries collapsed until opened, filters by
kind without a reload, and a person's reply under the person's name. Screenshots in
English and Spanish at both widths (var/screenshots, or AGENTLOOP_SCREENSHOTS_DIR)."""

from datetime import timedelta

import pytest

from conversations.ingest import Inbound, admit
from conversations.models import Conversation
from tests.end_to_end.test_console_browser import PHONE, no_horizontal_scroll, operator
from tests.end_to_end.test_story import T0, person_and_control_command, story_url
from tests.support.browser import assert_no_console_errors, page_for, screenshot

pytestmark = pytest.mark.e2e
DESKTOP = {"width": 1440, "height": 1000}
LONG = ("Necesito reagendar todas mis horas " * 300)[:10_000]


def test_the_story_holds_and_reads_as_a_timeline(processes, browser, make_channel):
    channel = make_channel("chan")
    conversation = person_and_control_command(channel)
    admit(channel, Inbound(platform_message_id="3", chat_id="7", sender_id="7", sender_name="Ana", text=LONG),
          now=T0 + timedelta(seconds=20))
    assert Conversation.objects.count() == 1
    web = processes.web(wait=False)
    url, credentials = story_url(conversation.pk), operator()

    for language in ("en", "es"):
        for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
            page = page_for(browser, web.url, *credentials, viewport=viewport)
            page.context.set_extra_http_headers({"Accept-Language": language})
            page.goto(url)
            entries = page.locator(".story-entry")
            assert entries.count() >= 8
            assert no_horizontal_scroll(page), f"{language} {name}: the page scrolls sideways"
            # Collapsed by default; a click opens one, and its whole text is inside.
            assert page.locator(".story-entry details[open]").count() == 0
            long_entry = page.locator(".story-entry.story-message", has_text="Necesito reagendar").last
            assert not long_entry.locator(".story-text").is_visible()
            long_entry.locator("summary").click()
            assert long_entry.locator(".story-text").is_visible()
            assert no_horizontal_scroll(page), f"{language} {name}: the opened long message scrolls sideways"
            # The person's reply carries her name.
            person = page.locator(".story-entry.story-turn", has_text="olga")
            assert person.count() == 1 and "Agent" not in person.inner_text()
            assert "olga" in page.locator(".story-holder").inner_text()
            # A filter hides the other kinds' entries, without a reload.
            page.locator('.story-filter[data-filter="turns"]').click()
            assert page.locator('.story-entry[data-group="turns"]').first.is_hidden()
            assert page.locator('.story-entry[data-group="messages"]').first.is_visible()
            page.locator('.story-filter[data-filter="turns"]').click()
            assert page.locator('.story-entry[data-group="turns"]').first.is_visible()
            if language == "es":
                assert "Devolver al agente" in page.locator(".story-header").inner_text()
            page.evaluate("window.scrollTo(0, 0)")  # a full-page shot shows a sticky header where it stands
            screenshot(page, f"story-{name}-{language}")
            # The header, its state and its control stay in view at the end of the timeline.
            page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")
            top = page.locator(".story-header").evaluate("e => e.getBoundingClientRect().top")
            assert 0 <= top < 5 and page.locator('#hold button[value="give_back"]').is_visible()
            assert_no_console_errors(page)
            page.context.close()
