"""Browser tests with Playwright, driving Debian's Chromium headless shell (Playwright's own
browser downloads are never used: scripts/system-deps.sh apt-installs `chromium-headless-shell`).

    def test_page(processes, browser, django_user_model):
        web = processes.web()
        django_user_model.objects.create_superuser("admin", "", "pw")
        page = page_for(browser, web.url, "admin", "pw")
        page.goto("/admin/")                      # relative to web.url
        assert_no_console_errors(page)
        screenshot(page, "admin-index")

The `browser` fixture is function-scoped on purpose. While Playwright's sync API is started,
its asyncio event loop counts as *running* in the test's thread (it lives in a greenlet of
that thread), so in that thread:
  - `asyncio.run(...)` and asgiref's `async_to_sync(...)` raise RuntimeError. A session-wide
    browser would break every later test that uses them (test_fake_telegram_api.py, ...);
    inside a browser test, call such code (a `channel_layer.group_send`, product code that
    uses `asyncio.run` such as delivery.ledger) through `off_loop(fn, *args)`, which runs it
    in a fresh thread.
  - Django would raise SynchronousOnlyOperation on every ORM call, and would keep a second
    set of database connections for "async" code. The fixture makes Django disregard
    Playwright's loop (only that loop) and keep using the test's own connections. It does
    not set DJANGO_ALLOW_ASYNC_UNSAFE: processes.web() copies os.environ into the servers
    it starts, where that would hide real sync-in-async bugs.
"""

import asyncio
import contextlib
import os
import re
import threading
import time
import warnings
from pathlib import Path

import pytest

from tests.support import host_network

BASE_DIR = Path(__file__).resolve().parents[2]
# The headless shell: Chromium's engine without the desktop browser around it (what
# Playwright itself drives for headless runs). The same pages, in half the time and a third
# of the CPU of /usr/bin/chromium started headless (50 page loads over 5 launches: 10.4 s
# and 4.9 CPU-s against 19.7 s and 13.8 CPU-s; Chromium took 190 of a run's 1,750 CPU-s).
CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
# Without the background-networking flags Chromium tries to reach Google's services, and on a
# closed network its connections (ours included) get refused.
CHROMIUM_ARGS = [
    "--no-sandbox",  # we run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Chromium asks every site for /favicon.ico on its own, at a time of its choosing, and logs a
# 404 as a console error: browser noise, not the page's, and a race if counted.
ALWAYS_IGNORED = [r"Failed to load resource: .*\(\S+/favicon\.ico:\d+\)$"]
# Playwright's default is 30 s per action; a broken page should fail fast.
DEFAULT_TIMEOUT_MS = 10_000


# What a test does when Chromium itself goes away under it (the browser process ended, or
# a page's renderer crashed): the error a test then meets, whatever it was doing. Such a
# test is run once more, from the start (pytest-rerunfailures; tests/conftest.py marks
# every test that uses the `browser` fixture). Seen once in CI, at a test's first page, at
# the log-in form, before any page of ours had loaded: a crash of the browser, not of the
# product. A test that fails twice fails; why the browser process ended is printed at the
# end of the run (_report_browser_gone).
BROWSER_GONE = [r"TargetClosedError", r"Target crashed", r"[Pp]age crashed"]


@pytest.fixture
def browser(monkeypatch, tmp_path):
    """A headless Chromium (playwright.sync_api.Browser), closed after the test."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/system-deps.sh as root "
                    "(apt-get install chromium-headless-shell)",
                    pytrace=False)
    # Playwright's driver writes what it sees of the browser process (its launch line, its
    # stderr, how it ended) to this file: read back only if Chromium went away by itself.
    # Set only while the driver starts (it reads them then): the web servers and workers a
    # test starts copy this process's environment, and DEBUG is also the product's setting.
    log = tmp_path / "chromium.log"
    with host_network.browsing() as network_hold, contextlib.ExitStack() as stack:
        with monkeypatch.context() as driver_only:
            driver_only.setenv("DEBUG", "pw:browser")
            driver_only.setenv("DEBUG_FILE", str(log))
            pw = stack.enter_context(_playwright_beside_django(monkeypatch))
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        went_away = []  # set when the browser process ends, unless we closed it first
        chromium.on("disconnected", lambda _: went_away.append(True))
        _driver_logs[id(chromium)], _network_holds[id(chromium)] = log, network_hold
        try:
            yield chromium
        finally:
            ended_by_itself = bool(went_away)
            chromium.close()
            del _driver_logs[id(chromium)], _network_holds[id(chromium)]
    if ended_by_itself:
        _report_browser_gone(log)


_driver_logs = {}  # id(browser) -> its driver's log, while the fixture holds it
_network_holds = {}  # id(browser) -> its host_network.Browsing, while the fixture holds it


def let_network_changes_through(page):
    """Between two pages of a long test: if a change of the host's network waits for this
    browser (a cluster test's start or end, tests/support/host_network.py), leave the page
    for about:blank (no request or websocket in flight for the change to abort) and let the
    change go. The next page is loaded by the caller, as it would have been."""
    if host_network.change_waiting():
        page.goto("about:blank")
        _network_holds[id(page.context.browser)].let_changes_through()


def driver_log(browser):
    """The file Playwright's driver writes about `browser`'s process (`<launched> pid=…`)."""
    return _driver_logs[id(browser)]


class ChromiumWentAway(UserWarning):
    pass


def _report_browser_gone(log):
    """A warning (pytest prints them at the end of the run, a rerun's included) with the
    end of the driver's log of the browser: its exit code or signal, a crash's stack."""
    # The driver writes its log through a stream: the process's end may land a moment later.
    deadline = time.monotonic() + 2
    while not _says_how_it_ended(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log written)"]
    # Without a system bus (none in a container) Chromium logs a dbus error several times a second.
    tail = "\n".join([line for line in lines if "ERROR:dbus/" not in line][-40:])
    warnings.warn(ChromiumWentAway(f"Chromium went away during the test, not closed by it; the end of its "
                                   f"log:\n{tail}"), stacklevel=1)


def _says_how_it_ended(log):
    return log.exists() and "<process did exit" in log.read_text(errors="replace")


@contextlib.contextmanager
def _playwright_beside_django(monkeypatch):
    """Playwright's sync API, started so that Django in this thread works as if it were not:
    (1) Django's async-safety check (django.utils.asyncio.async_unsafe) looks past
    Playwright's loop, so ORM calls in the test do not raise SynchronousOnlyOperation;
    (2) while any loop runs, Django looks its connections up per async context rather than
    per thread, so the test's own connections are installed there too: the ORM keeps the
    test's connection (and transaction) instead of opening one that nothing would close
    (on PostgreSQL that one blocked dropping the test database)."""
    import django.utils.asyncio
    from django.db import connections
    from playwright.sync_api import sync_playwright

    own = {conn.alias: conn for conn in connections.all()}  # this thread's, as seen before any loop runs
    with sync_playwright() as pw:
        playwright_loop = asyncio.get_running_loop()

        def get_running_loop():
            loop = asyncio.get_running_loop()
            if loop is playwright_loop:
                raise RuntimeError("no running event loop (Playwright's is disregarded)")
            return loop

        monkeypatch.setattr(django.utils.asyncio, "get_running_loop", get_running_loop)
        for alias, conn in own.items():
            connections[alias] = conn
        try:
            yield pw
        finally:
            for conn in connections.all(initialized_only=True):
                if conn is not own.get(conn.alias):
                    conn.close()
                del connections[conn.alias]
            monkeypatch.setattr(django.utils.asyncio, "get_running_loop", asyncio.get_running_loop)


def off_loop(fn, *args, **kwargs):
    """Call fn(*args, **kwargs) in a fresh thread and return its result (or raise its error).

    For code that needs `asyncio.run`/`async_to_sync` while a browser is open. The thread's
    own database connections are closed when it ends."""
    result = {}

    def run():
        from django.db import connections

        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="off-loop")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def collect_console(page):
    """Record the page's console errors and uncaught exceptions (idempotent); returns the list."""
    if not hasattr(page, "_agentloop_console_errors"):
        errors = page._agentloop_console_errors = []

        def on_console(message):
            if message.type == "error":
                location = message.location or {}
                where = f" ({location.get('url')}:{location.get('lineNumber')})" if location.get("url") else ""
                errors.append(f"console.error: {message.text}{where}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    return page._agentloop_console_errors


def console_errors(page):
    """The console errors and uncaught exceptions recorded so far on this page."""
    return list(collect_console(page))


def assert_no_console_errors(page, ignore=()):
    """Fail if the page logged a console error or threw; `ignore`: regexes of errors to allow
    (besides the automatic /favicon.ico request's 404, always allowed)."""
    patterns = [*ALWAYS_IGNORED, *ignore]
    errors = [e for e in console_errors(page) if not any(re.search(pattern, e) for pattern in patterns)]
    assert not errors, f"console errors on {page.url}:\n" + "\n".join(errors)


def page_for(browser, base_url, username, password, viewport=None):
    """A new page, in its own browser context (cookies), logged in as `username` through the
    real Django admin login form (/admin/login/; so a staff user). Relative URLs in
    page.goto() resolve against base_url; console errors are collected from the start.
    viewport: e.g. {"width": 390, "height": 844}; default Playwright's 1280x720."""
    options = {"base_url": base_url}
    if viewport:
        options["viewport"] = viewport
    context = browser.new_context(**options)
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    context.set_default_navigation_timeout(DEFAULT_TIMEOUT_MS)
    page = context.new_page()
    collect_console(page)
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("input[type=submit], button[type=submit]")
    if "/admin/login/" in page.url:
        note = page.locator(".errornote, .errorlist")
        reason = note.first.inner_text() if note.count() else page.url
        raise AssertionError(f"admin login as {username!r} failed: {reason}")
    return page


def screenshots_dir():
    path = Path(os.environ.get("AGENTLOOP_SCREENSHOTS_DIR") or BASE_DIR / "var" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page, name, full_page=True):
    """Save a PNG of the page as <AGENTLOOP_SCREENSHOTS_DIR or var/screenshots>/<name>.png; returns its path."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name.removesuffix(".png")).strip("-") or "screenshot"
    path = screenshots_dir() / f"{stem}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
