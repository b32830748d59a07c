"""The channel form by platform (issue 53), through the real web server with an operator
logged in: the page shows the chosen platform's section only, the agent is chosen from the
registered ones, and a configuration that cannot work is refused with its reason beside
the field, saving nothing. The form is read and posted as a browser would (lxml's
form_values: every field's value as the page renders it)."""

from contextlib import closing

import lxml.html
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from conversations import platforms
from conversations.models import Channel
from tests.support.browser import assert_no_console_errors, page_for, screenshot
from tests.support.e2e import operator_session

pytestmark = pytest.mark.e2e
PASSWORD = "pw-olga-channels-1"
ADD = "/admin/conversations/channel/add/"
SECTIONS = ("Telegram settings", "WhatsApp settings", "Slack settings")
WIDE, PHONE = {"width": 1440, "height": 1000}, {"width": 390, "height": 844}
DEBOUNCE = {"en": "Debounce", "es": "Espera entre mensajes"}


def page_form(session, path):
    page = session.get(path)
    assert page.status_code == 200, page.text
    form = lxml.html.fromstring(page.text).get_element_by_id("channel_form")
    return page.text, dict(form.form_values())


def post_form(session, path, data):
    return session.post(path, data={**data, "csrfmiddlewaretoken": session.cookies["csrftoken"]})


def errors_beside(html, field):
    """The error messages the page shows in `field`'s own row (or its box, in a row of several)."""
    root = lxml.html.fromstring(html)
    found = []
    for box in root.xpath(f'//*[contains(concat(" ", normalize-space(@class), " "), " field-{field} ")]'):
        holders = [box, box.getparent()] if "fieldBox" in box.get("class") else [box]
        for holder in holders:
            found += [item.text_content().strip()
                      for item in holder.xpath('.//ul[contains(@class, "errorlist")]/li')]
    return found


def add(session, kind, **changes):
    _, data = page_form(session, f"{ADD}?kind={kind}")
    data.update({"slug": f"new-{kind}", "kind": kind, "is_active": "on", "routing_rules-TOTAL_FORMS": "0",
                 "routing_rules-INITIAL_FORMS": "0"})
    data.update(changes)
    return post_form(session, ADD, {k: v for k, v in data.items() if v is not None})


# (kind, what the operator changed, the field the reason stands beside, words of the reason)
UNWORKABLE = [
    ("telegram", {}, "telegram_bot_token", "an active telegram channel needs its bot token"),
    ("whatsapp", {"whatsapp_phone_number_id": "1234567"}, "whatsapp_token", "needs its token"),
    ("whatsapp", {"whatsapp_token": "EAAG-token"}, "whatsapp_phone_number_id", "needs its phone number id"),
    ("slack", {}, "slack_bot_token", "an active slack channel needs its bot token"),
    # Without them every request the platform sends is refused (its signature cannot be checked).
    ("whatsapp", {"whatsapp_phone_number_id": "1234567", "whatsapp_token": "EAAG-token"}, "whatsapp_app_secret",
     "needs its app secret"),
    ("whatsapp", {"whatsapp_phone_number_id": "1234567", "whatsapp_token": "EAAG-token"}, "whatsapp_verify_token",
     "needs its verify token"),
    ("slack", {"slack_bot_token": "xoxb-1"}, "slack_signing_secret", "an active slack channel needs its signing secret"),
    ("api", {"agent": "no-such-agent"}, "agent", "no-such-agent"),
    ("api", {"window_open": "99999"}, "window_open", "at most"),
    ("api", {"max_wait": "0"}, "max_wait", "longest window"),
    ("api", {"max_wait": "99999"}, "max_wait", "at most"),
    ("api", {"window_album": "30", "max_wait": "15"}, "max_wait", "longest window"),
]


def test_configurations_that_cannot_work_are_refused_beside_the_field_and_nothing_is_saved(processes):
    User.objects.create_superuser("olga", "olga@example.com", PASSWORD)
    web = processes.web()
    with closing(operator_session(web, "olga", PASSWORD)) as admin:
        for kind, changes, field, reason in UNWORKABLE:
            refused = add(admin, kind, **changes)
            assert refused.status_code == 200, (kind, changes, refused.headers)
            beside = errors_beside(refused.text, field)
            assert any(reason in message.lower() for message in beside), (kind, changes, field, beside)
            assert not Channel.objects.exists(), (kind, changes)


def test_a_valid_telegram_and_a_valid_api_channel_save_each_showing_its_own_section_only(processes):
    User.objects.create_superuser("olga", "olga@example.com", PASSWORD)
    web = processes.web()
    with closing(operator_session(web, "olga", PASSWORD)) as admin:
        # The agent is a choice among the registered agents, not free text.
        html, _ = page_form(admin, ADD)
        options = lxml.html.fromstring(html).xpath('//select[@name="agent"]/option/@value')
        assert sorted(filter(None, options)) == sorted(settings.AGENTLOOP_AGENTS)

        saved = add(admin, "telegram", telegram_bot_token="4242:TOKEN", agent="demo")
        assert saved.status_code == 302, errors_beside(saved.text, "telegram_bot_token") or saved.text[-3000:]
        telegram = Channel.objects.get(slug="new-telegram")
        assert (telegram.setting("bot_token"), telegram.agent, telegram.send_blocked) == ("4242:TOKEN", "demo", "")
        # Not active yet: a channel being set up may wait for its token.
        assert add(admin, "slack", slug="later", is_active="").status_code == 302
        assert Channel.objects.get(slug="later").send_blocked == "no bot_token set"

        saved = add(admin, "api", window_closed="0.8")
        assert saved.status_code == 302, saved.text[-3000:]
        api = Channel.objects.get(slug="new-api")
        assert (api.kind, api.window_closed, api.agent) == ("api", 0.8, "echo")

        page, data = page_form(admin, f"/admin/conversations/channel/{api.pk}/change/")
        assert "API settings" in page and not [name for name in SECTIONS if name in page]
        assert not [name for name in data if name.startswith(("telegram_", "whatsapp_", "slack_"))]
        page, _ = page_form(admin, f"/admin/conversations/channel/{telegram.pk}/change/")
        assert "Telegram settings" in page and "WhatsApp settings" not in page and "Slack settings" not in page

        # The add page renders every platform's section, each marked with its kind for the
        # page's script to show the chosen one (below, in the browser).
        page, _ = page_form(admin, ADD)
        marked = lxml.html.fromstring(page).xpath('//fieldset[contains(@class, "platform-section")]/@class')
        with_settings = {platform.kind for platform in platforms.all_platforms() if platform.settings}
        assert {"api", "slack", "telegram", "whatsapp"} <= with_settings  # webchat has none
        assert {c.split("platform-")[-1].split()[0] for c in marked} == with_settings


def visible_sections(page, language):
    """The platforms whose section the page shows."""
    title = {"en": "{} settings", "es": "Ajustes de {}"}[language]
    return [label for label in ("API", "Telegram", "WhatsApp", "Slack")
            if page.get_by_role("heading", name=title.format(label), exact=True).is_visible()]


@pytest.mark.parametrize(("viewport", "language"), [(WIDE, "en"), (PHONE, "en"), (WIDE, "es"), (PHONE, "es")])
def test_the_add_page_shows_the_chosen_kinds_section_and_opens_a_refused_section(processes, browser, viewport,
                                                                                language):
    User.objects.create_superuser("olga", "olga@example.com", PASSWORD)
    web = processes.web()
    page = page_for(browser, web.url, "olga", PASSWORD, viewport=viewport)
    page.context.set_extra_http_headers({"Accept-Language": language})
    page.goto(ADD)
    shot = f"channel-add-{language}-{viewport['width']}"
    assert visible_sections(page, language) == ["API"]  # the default kind
    screenshot(page, shot)
    page.select_option("#id_kind", "telegram")
    assert visible_sections(page, language) == ["Telegram"]
    page.select_option("#id_kind", "slack")
    assert visible_sections(page, language) == ["Slack"]
    page.select_option("#id_kind", "telegram")

    # Refused: the reasons beside their fields, the collapsed Debounce section opened to show its own.
    page.fill("#id_slug", "shop")
    page.locator("summary", has_text=DEBOUNCE[language]).click()
    page.fill("#id_window_open", "99999")
    with page.expect_navigation():
        page.click("[name=_save]")
    assert page.locator(".field-telegram_bot_token .errorlist").is_visible()
    assert page.locator(".field-window_open .errorlist").is_visible()
    assert visible_sections(page, language) == ["Telegram"]
    assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1")
    assert not Channel.objects.exists()
    screenshot(page, f"{shot}-refused")

    # Mended, it saves; its page shows its own platform's section, and the kind as it is.
    page.fill("#id_telegram_bot_token", "4242:TOKEN")
    page.fill("#id_window_open", "4")
    with page.expect_navigation():
        page.click("[name=_continue]")
    assert Channel.objects.get(slug="shop").setting("bot_token") == "4242:TOKEN"
    assert visible_sections(page, language) == ["Telegram"] and not page.locator("#id_kind").count()
    assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1")
    screenshot(page, shot.replace("add", "change"))
    assert_no_console_errors(page)
