"""The manual's screenshots of the operator pages, taken again by one command:

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--only overview,ledger]

Starts the product's web server on a throwaway SQLite database (a temporary folder,
removed after) holding the demo data the operator pages' browser test plants
(tests/support/operator_data.py, with short texts), logs in through the admin's form in Debian's
Chromium (tests/support/browser.py's launch) and writes one PNG per shot below: the admin's pages
— the overview, a channel's form, the delivery ledger, the approvals waiting — at a
desktop's width and a phone's, some in Spanish.

The console's shots (dashboard.png, playground.png, story*.png, dashboard-phone-es.png)
are live moments the console's browser tests reach with a worker running — a merge while
the agent types, a take over from the feed —, so those tests take them:
`AGENTLOOP_SCREENSHOTS_DIR=docs/screenshots` (docs/testing.md)."""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, page_for, screenshot  # noqa: E402

DESKTOP, PHONE = {"width": 1440, "height": 1000}, {"width": 390, "height": 844}


@dataclass(frozen=True)
class Shot:
    name: str  # the file's name in docs/screenshots, without .png
    path: str  # "{channel}" stands for the demo channel's page
    viewport: dict
    language: str = "en"


SHOTS = [
    Shot("overview", "/admin/", DESKTOP),
    Shot("overview-es", "/admin/", DESKTOP, "es"),
    Shot("overview-phone", "/admin/", PHONE),
    Shot("channel-form", "{channel}", DESKTOP),
    Shot("channel-form-es", "{channel}", DESKTOP, "es"),
    Shot("ledger", "/admin/delivery/outboundmessage/", DESKTOP),
    Shot("ledger-phone-es", "/admin/delivery/outboundmessage/", PHONE, "es"),
    Shot("approvals-es", "/admin/tools/proposal/?state__exact=pending", DESKTOP, "es"),
]

# Run in the throwaway database's environment: the demo data, and the pages to show.
PLANT = """
from tests.support.operator_data import plant
planted = plant(long=False)
print(json.dumps({"channel": f"/admin/conversations/channel/{planted.conversation.channel_id}/change/",
                  "operator": planted.operator}))
"""


def product_env(folder: Path) -> dict:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "agentloop.settings",
            "DATABASE_URL": f"sqlite:///{folder / 'demo.sqlite3'}", "SECRET_KEY": secrets.token_urlsafe(50),
            "AGENTLOOP_METRICS_DIR": str(folder / "metrics"), "PYTHONUNBUFFERED": "1"}


def demo_database(env: dict) -> dict:
    """Migrated and planted; returns the demo channel's path and its operator."""
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=BASE_DIR, env=env, check=True)
    done = subprocess.run([*manage, "shell", "--command", f"import json\n{PLANT}"], cwd=BASE_DIR, env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def web_server(env: dict, log: Path) -> Iterator[str]:
    """The product's web server on a free port, until the block ends; yields its URL."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "agentloop.web_server", "--port", str(port)], cwd=BASE_DIR,
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server, log)
            yield url
        finally:
            server.terminate()
            server.wait(20)


def wait_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the web server ended:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit("the web server did not answer /healthz within 60 s")


def take(shots: list[Shot], url: str, demo: dict, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    os.environ["AGENTLOOP_SCREENSHOTS_DIR"] = str(out)  # where tests.support.browser.screenshot writes
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            for shot in shots:
                page = page_for(browser, url, *demo["operator"], viewport=shot.viewport)
                page.context.set_extra_http_headers({"Accept-Language": shot.language})
                page.goto(shot.path.format(**demo), wait_until="load")
                print(screenshot(page, shot.name, full_page=False))  # the first screen, as a person sees it
                page.context.close()
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=BASE_DIR / "docs" / "screenshots")
    parser.add_argument("--only", default="", help="comma-separated shot names (default: all)")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    shots = [shot for shot in SHOTS if not wanted or shot.name in wanted]
    with tempfile.TemporaryDirectory(prefix="agentloop-screenshots-") as folder:
        env = product_env(Path(folder))
        demo = demo_database(env)
        with web_server(env, Path(folder) / "web.log") as url:
            take(shots, url, demo, args.out.resolve())


if __name__ == "__main__":
    main()
