"""The operator console in a real browser (Debian's Chromium through Playwright) against
the product's real processes: the dashboard updating live from other processes (with
and without Redis), a playground round trip, phone width and the keyboard.

The screenshots in the README are the ones these tests take
(`AGENTLOOP_SCREENSHOTS_DIR=docs/screenshots`)."""

import pytest
from django.contrib.auth.models import User

from conversations.models import Channel
from tests.conftest import wait_until
from tests.fakes.openai_api import Delay, FakeOpenAI, Reply
from tests.support import local_http
from tests.support.browser import assert_no_console_errors, page_for, screenshot

pytestmark = pytest.mark.e2e
PHONE = {"width": 390, "height": 844}
WINDOWS = {f"window_{kind}": 3.0 for kind in ("closed", "greeting", "open", "neutral")}


def operator():
    User.objects.create_superuser("op", "op@example.com", "pw-op-console-1")
    return "op", "pw-op-console-1"


def live(page):
    page.wait_for_selector("#connection.pill-ok")


def no_horizontal_scroll(page):
    return page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1")


@pytest.mark.parametrize("layer", ["database relay", "redis"])
def test_dashboard_shows_what_other_processes_do_live(processes, browser, agent_key, request, layer):
    """The dashboard's web process is not the one that takes the message, and the turn
    is made by the worker: every update crosses processes."""
    env = {"REDIS_URL": request.getfixturevalue("redis_url")} if layer == "redis" else {}
    channel = Channel.objects.create(slug="shop", kind="api", agent="echo", agent_config={"delay": 1.0}, **WINDOWS)
    key = agent_key(channel)
    watched, other = processes.web(wait=False, **env), processes.web(wait=False, **env)
    processes.worker(**env)
    page = page_for(browser, watched.url, *operator())
    page.goto("/console/")
    live(page)
    assert page.locator("#buffers tbody tr").count() == 0

    response = local_http.post(f"{other.url}/api/v1/channels/shop/messages", headers={"Authorization": f"Bearer {key}"},
                          json={"message_id": "m1", "contact": "ana", "text": "¿tienen talla 38?"})
    assert response.status_code == 202, response.text

    row = page.locator("#buffers tbody tr", has_text="ana @ shop")
    row.wait_for()
    assert row.locator("td").nth(2).inner_text() == "3 sec closed"  # Intl's short unit in English
    assert page.locator("#feed", has_text="¿tienen talla 38? (buffered, window 3 sec)").count() == 1
    page.locator("#turns tbody tr", has_text="echo").wait_for(timeout=8000)  # the worker's turn, running
    page.locator("#feed li", has_text="done: ¿tienen talla 38?").wait_for(timeout=8000)
    page.locator("#ledger a", has_text="1 delivered").wait_for()
    assert page.locator("#buffers tbody tr").count() == 0
    assert_no_console_errors(page)


def test_playground_round_trip_countdown_merge_typing_reply(processes, browser):
    with FakeOpenAI() as fake:
        fake.script(Delay(2.0, then=Reply("Listo: el martes a las 10.")))
        Channel.objects.create(slug="playground", kind="webchat", agent="openai",
                               **{f"window_{kind}": 2.0 for kind in ("closed", "greeting", "open", "neutral")},
                               agent_config={"base_url": fake.url, "model": "fake-model",
                                                              "api_key_env": "FAKE_OPENAI_API_KEY"})
        web = processes.web(wait=False)
        processes.worker(FAKE_OPENAI_API_KEY="sk-test")
        page = page_for(browser, web.url, *operator())
        page.goto("/console/playground/")
        live(page)
        chat = page.locator("#chat-input")
        chat.fill("Hola")
        chat.press("Enter")
        chat.fill("¿me agendas el martes a las 10?")
        chat.press("Enter")

        page.wait_for_selector("#countdown:not([hidden])")
        assert page.locator("#countdown .label").inner_text().startswith("Waiting 2 sec for more messages")
        page.locator(".system-merge", has_text="Merged 2 messages into turn #").wait_for()
        page.wait_for_selector("#countdown", state="hidden")
        page.wait_for_selector("#typing:not([hidden])")
        screenshot(page, "playground")
        page.locator(".bubble-agent", has_text="Listo: el martes a las 10.").wait_for(timeout=8000)
        page.wait_for_selector("#typing", state="hidden")
        [model_request] = fake.requests()
        assert model_request.messages[-1]["content"] == "Hola\n¿me agendas el martes a las 10?"
        assert_no_console_errors(page)

        page.reload()  # the transcript comes back from the database
        live(page)
        page.locator(".bubble-agent", has_text="Listo: el martes a las 10.").wait_for()
        assert page.locator(".bubble-me").count() == 2


def test_playground_catches_a_repeated_order_and_links_into_the_admin(processes, browser):
    """The incident by hand with the demo agent: the guard's catch is shown in the chat
    with a link to the caught duplicate in the admin, and on the dashboard."""
    Channel.objects.create(slug="playground", kind="webchat", agent="demo",
                           **{f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral")})
    web = processes.web(wait=False)
    processes.worker()
    page = page_for(browser, web.url, *operator())
    page.goto("/console/playground/")
    live(page)
    chat = page.locator("#chat-input")
    for n in (1, 2):
        chat.fill("agéndame psicología el martes a las 10")
        chat.press("Enter")
        wait_until(lambda: page.locator(".bubble-agent").count() == n, timeout=10, message=f"reply {n}")
    caught = page.locator(".system-duplicate a", has_text="Duplicate prevented by the guard")
    caught.wait_for()

    dashboard = page.context.new_page()
    dashboard.goto("/console/")
    live(dashboard)
    dashboard.locator("#duplicates li", has_text="calendar_create_event").wait_for()
    chat.fill("¿y el jueves?")
    chat.press("Enter")
    dashboard.locator("#buffers tbody tr", has_text="@ playground").wait_for()
    screenshot(dashboard, "dashboard")
    assert_no_console_errors(dashboard)

    caught.click()
    page.wait_for_url("**/admin/audit/caughtduplicate/*/change/")
    assert "calendar_create_event" in page.content()
    assert_no_console_errors(page)


def test_console_pages_fit_a_phone_and_work_from_the_keyboard(processes, browser):
    Channel.objects.create(slug="playground", kind="webchat", agent="demo")
    web = processes.web()
    page = page_for(browser, web.url, *operator(), viewport=PHONE)
    page.goto("/console/")
    live(page)
    assert no_horizontal_scroll(page)
    page.goto("/console/playground/")
    live(page)
    assert no_horizontal_scroll(page)
    page.locator("#chat-input").focus()
    page.keyboard.type("hola")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent.trim()") == "Send"
    page.keyboard.press("Enter")  # the focused button sends
    page.locator(".bubble-me", has_text="hola").wait_for()
    assert page.locator("#chat-input").input_value() == ""
    assert_no_console_errors(page)


def test_console_pages_need_a_staff_login(processes):
    web = processes.web()
    for path in ("/console/", "/console/playground/"):
        response = local_http.get(f"{web.url}{path}")
        assert response.status_code == 302 and "/admin/login/" in response.headers["location"]


def test_an_auditor_reads_but_cannot_change_and_never_sees_a_token(processes, browser, make_conversation):
    from django.core.management import call_command
    from django.utils import timezone

    from audit.events import record
    from audit.models import EventKind
    from delivery.models import OutboundMessage
    from tools.models import ActionClaim, ClaimState, Proposal

    token, secret = "987654321:AAF-very-secret-bot-token", "hook-secret-never-shown"
    call_command("createuser", "audrey", "--role", "auditor", "--password", "pw-audrey-console-1")
    channel = Channel.objects.create(slug="tg", kind="telegram", platform_settings={
        "bot_token": token, "webhook_secret": secret})
    conversation = make_conversation(channel)
    event = record(EventKind.DUPLICATE_PREVENTED, conversation=conversation, target="claim 1",
                   summary="calendar_create_event not repeated (duplicate)", tool="calendar_create_event")
    row = OutboundMessage.objects.create(conversation=conversation, channel=channel, chat_id="ana", text="Listo.",
                                         last_error=f"https://api.telegram.org/bot{token}/sendMessage timed out")
    later = timezone.now() + timezone.timedelta(hours=1)
    claim = ActionClaim.objects.create(scope="contact:1", action="email_send", fingerprint="f" * 64,
                                       state=ClaimState.PROPOSED, expires_at=later, lease_until=later,
                                       conversation_id=conversation.pk, channel_slug="tg")
    Proposal.objects.create(claim=claim, expires_at=later)
    web = processes.web()
    page = page_for(browser, web.url, "audrey", "pw-audrey-console-1")

    readable = ["/admin/", "/admin/audit/auditevent/", f"/admin/audit/auditevent/{event.pk}/change/",
                f"/admin/audit/caughtduplicate/{event.pk}/change/", "/admin/tools/actionclaim/",
                f"/admin/tools/actionclaim/{claim.pk}/change/", "/admin/delivery/outboundmessage/",
                f"/admin/delivery/outboundmessage/{row.pk}/change/"]
    for path in readable:
        response = page.goto(path)
        assert response.status == 200, path
        html = page.content()
        assert token not in html and secret not in html, path
        # No save, add or delete anywhere on an auditor's page (unfold's buttons and links).
        assert page.locator('[name=_save], [name=_continue], a[href$="/add/"], a[href$="/delete/"]').count() == 0, path
    page.goto("/console/")
    live(page)
    page.locator("#proposals li", has_text="email_send").wait_for()
    assert page.locator("#proposals button").count() == 0  # watching, not deciding
    assert token not in page.content()
    for forbidden in (f"/admin/conversations/channel/{channel.pk}/change/", "/admin/conversations/agentkey/",
                      "/console/playground/"):
        assert page.goto(forbidden).status == 403, forbidden
    screenshot(page, "auditor-forbidden")
    assert_no_console_errors(page, ignore=[r"status of 403"])


def test_an_operator_applies_a_proposal_from_the_dashboard_once(processes, browser, make_conversation):
    """Apply on the dashboard runs the proposed action once; the card leaves the list."""
    from tools import guard
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy
    from tools.registry import Scope

    channel = Channel.objects.create(slug="tg", kind="api")
    guard.ensure_policies()
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval="operator")
    guard.forget_policies()
    outcome = guard.invoke("calendar_create_event", {"title": "Kine", "start_datetime": "2026-12-03T09:00"},
                           Scope.of_conversation(make_conversation(channel)), actor="test")
    web = processes.web()
    page = page_for(browser, web.url, *operator())
    page.goto("/console/")
    live(page)
    card = page.locator("#proposals li", has_text="calendar_create_event")
    card.wait_for()
    assert "Kine" in card.inner_text()
    card.get_by_role("button", name="Apply").click()
    page.locator("#feed li", has_text=f"Proposal {outcome.proposal_id}: applied").wait_for()
    page.locator("#proposals li").first.wait_for(state="detached")
    assert Proposal.objects.get(pk=outcome.proposal_id).state == ProposalState.APPLIED
    assert CalendarEvent.objects.filter(title="Kine").count() == 1
    assert_no_console_errors(page)


def test_playground_attaches_an_image_shows_its_thumbnail_and_the_model_sees_it(processes, browser):
    """Attach in a real browser: the file picked goes up with the typed caption, the
    bubble shows the image by its signed link once the worker has read it back, the
    model gets it as an image part, and the thumbnail comes back with the transcript."""
    from tests.unit.test_media import jpeg

    with FakeOpenAI() as fake:
        fake.script(Reply("Es una boleta."))
        Channel.objects.create(slug="playground", kind="webchat", agent="openai",
                               **{f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral")},
                               agent_config={"base_url": fake.url, "model": "fake-model",
                                             "api_key_env": "FAKE_OPENAI_API_KEY"})
        web = processes.web(wait=False)
        processes.worker(FAKE_OPENAI_API_KEY="sk-test")
        page = page_for(browser, web.url, *operator())
        page.goto("/console/playground/")
        live(page)
        page.locator("#chat-input").fill("¿qué dice?")
        page.locator("#chat-file").set_input_files(
            {"name": "boleta.jpg", "mimeType": "image/jpeg", "buffer": jpeg(120, 90)})
        thumb = page.locator(".bubble-me img.bubble-thumb:not(.loading)")
        thumb.wait_for(timeout=10000)
        assert page.evaluate("document.querySelector('.bubble-me img.bubble-thumb').naturalWidth") == 120
        assert page.locator(".bubble-me .text").inner_text() == "¿qué dice?"
        assert page.locator("#chat-input").input_value() == ""
        page.locator(".bubble-agent", has_text="Es una boleta.").wait_for(timeout=10000)
        screenshot(page, "playground-attach")
        [model_request] = fake.requests()
        content = model_request.messages[-1]["content"]
        assert [part["type"] for part in content] == ["text", "image_url"]
        assert content[0]["text"] == "[photo] ¿qué dice?"
        page.reload()  # the transcript brings the thumbnail back
        live(page)
        page.locator(".bubble-me img.bubble-thumb:not(.loading)").wait_for()
        # The signed link answers 404 until the worker has read the upload back: the page tries again.
        assert_no_console_errors(page, ignore=[r"status of 404.*/files/"])
