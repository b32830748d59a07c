"""The test infrastructure itself: a real browser logs in to the real web server, and a
throwaway redis-server carries a channels-redis group message."""

import asyncio
import os
import re
import signal

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from tests.support.browser import assert_no_console_errors, console_errors, driver_log, off_loop, page_for, screenshot


@pytest.mark.e2e
def test_admin_login_in_a_real_browser(processes, browser):
    web = processes.web()
    User.objects.create_superuser("smoke", "smoke@example.com", "pw-smoke-1")

    page = page_for(browser, web.url, "smoke", "pw-smoke-1")
    page.goto("/admin/")

    reverse("admin:index")  # loads the URLconf, which may set the site's titles
    title = page.title()
    assert "Django" in title or str(admin.site.site_title) in title, title
    assert str(admin.site.site_header).lower() in page.locator("body").inner_text().lower()
    # The user menu at the foot of the sidebar names who is logged in.
    assert "smoke" in page.locator("#nav-sidebar").inner_text().lower()
    assert_no_console_errors(page)
    path = screenshot(page, "smoke-admin-index")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


_attempts = []  # kept across the rerun: pytest-rerunfailures runs the item again in this process


@pytest.mark.e2e
def test_a_test_whose_chromium_dies_is_run_once_more(browser):
    """The first attempt kills its own Chromium (SIGKILL, its pid from the driver's log)
    and then needs it, as a test under a crashed browser would; the second attempt is the
    rerun tests/support/browser.py BROWSER_GONE allows, and passes. Without the rerun (or with
    patterns that miss the error a dead browser raises) this test fails."""
    _attempts.append(1)
    page = browser.new_context().new_page()
    if len(_attempts) == 1:
        assert "DEBUG_FILE" not in os.environ  # the driver's setting, not the test's processes'
        pid = int(re.search(r"<launched> pid=(\d+)", driver_log(browser).read_text())[1])
        os.kill(pid, signal.SIGKILL)
        page.goto("data:text/html,<p>never</p>")
        raise AssertionError("the page answered after its browser was killed")
    page.goto("data:text/html,<p>again</p>")
    assert page.inner_text("p") == "again" and len(_attempts) == 2


@pytest.mark.e2e
def test_console_errors_are_caught(processes, browser):
    web = processes.web()
    User.objects.create_superuser("smoke", "smoke@example.com", "pw-smoke-1")
    page = page_for(browser, web.url, "smoke", "pw-smoke-1", viewport={"width": 390, "height": 844})
    assert page.viewport_size == {"width": 390, "height": 844}

    page.evaluate("console.error('deliberate'); setTimeout(() => { throw new Error('thrown') }, 0)")
    page.wait_for_timeout(100)
    errors = console_errors(page)
    assert any("deliberate" in e for e in errors) and any("thrown" in e for e in errors), errors
    with pytest.raises(AssertionError, match="deliberate"):
        assert_no_console_errors(page)
    assert_no_console_errors(page, ignore=["deliberate", "thrown"])

    # Playwright's loop counts as running in this thread: asyncio.run only works off it.
    pending = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(pending)
    pending.close()
    assert off_loop(lambda: asyncio.run(asyncio.sleep(0, "ran"))) == "ran"


def test_redis_url_carries_a_channels_group_message(redis_url):
    from channels_redis.core import RedisChannelLayer

    async def round_trip():
        layer = RedisChannelLayer(hosts=[redis_url])
        channel = await layer.new_channel()
        await layer.group_add("smoke", channel)
        await layer.group_send("smoke", {"type": "smoke.hello", "text": "hi"})
        message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.flush()
        await layer.close_pools()
        return message

    assert asyncio.run(round_trip()) == {"type": "smoke.hello", "text": "hi"}
