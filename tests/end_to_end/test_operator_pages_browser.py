"""Every operator page in Chromium (issue 53): the admin's overview, every registered
model's change list, one of its change pages and its add page (where adding is allowed),
every page the sidebar links to (the live dashboard, the playground, the limits, the
approvals waiting, …) and a conversation's story — at a desktop's width and a phone's, in
English and in Spanish, with a 10,000-character message, a 10,000-character reply, a long
name and a proposal with long arguments in the data (tests/support/operator_data.py).

Per page: it answers 200, the server logs no error while it is served and the browser's
console none (an uncaught exception, a refused request); nothing scrolls sideways (no
element drawn past the right edge, but inside a box that scrolls by itself); the page's
key element is there (the overview's cards, the change list's table, the form, …); in
Spanish, no English domain word in the visible text. The pages come from the admin's
registry and the sidebar, so a new model or page is visited without a line here.

Every problem found is written to var/operator-pages.md (page by page), and the test
fails listing them. One server, one browser, one context per language (visit_all)."""

import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse

from agentloop.console import navigation
from tests.end_to_end.test_console_browser import PHONE
from tests.support.browser import ALWAYS_IGNORED, BASE_DIR, console_errors, let_network_changes_through, page_for
from tests.support.operator_data import plant

pytestmark = pytest.mark.e2e
VIEWPORTS = {"desktop": {"width": 1440, "height": 1000}, "phone": PHONE}
LANGUAGES = ("en", "es")
REPORT = BASE_DIR / "var" / "operator-pages.md"
timings: list = []

# The product's English words for its own things (regular expressions, whole words,
# any case): none may be read on a Spanish page.
DOMAIN_WORDS = [
    "channels?", "conversations?", "turns?", "ledger", "claims?", "proposals?", "buffers?", "buffered", "contacts?",
    "repl(?:y|ies)", "messages?", "agents?", "tools?", "polic(?:y|ies)", "approvals?", "approve", "reject",
    "duplicates?", "schedules?", "scheduled", "deliver(?:y|ed)", "inbound", "outbound", "pending", "windows?",
    "limits?", "take ?over", "give back", "held", "dashboard", "playground", "settings", "overview", "events?",
    "keys?", "routing", "rules?", "story", "abandoned", "unreachable", "waiting", "failed",
]
# Words those pages may show in English: names, and the glossary's own choices.
ALLOWED_IN_SPANISH = {
    "worker", "workers",  # docs/languages.md's glossary keeps "worker", as operators say it
}
# Pages whose text is English by design, not by omission (their reason).
ENGLISH_BY_DESIGN = {
    "api-docs": "the API's reference, for the developers of its clients: its names are the API's",
}
# The test leaving a console page (the dashboard, the playground) before its websocket is
# up: Chromium says so in the console. The leaving is the test's, not the page's.
LEFT_WHILE_CONNECTING = r"WebSocket is closed before the connection is established"
# The element each named page is for; a page the sidebar gains later needs an <h1> at least.
KEY_ELEMENTS = {
    "admin:index": "#card-approvals", "console-dashboard": "#connection", "console-playground": "#chat-input",
    "console-story": ".story-header", "api-docs": "#swagger-ui",
}

# What the page looks like to the test, measured in one call: sideways scroll, the elements
# drawn past the right edge outside any box that scrolls by itself (the outermost of
# each), the key element, the visible text.
MEASURE = """([key, withText]) => {
  const width = window.innerWidth;
  // Inside a box that scrolls by itself (a wide table's), or that cuts its text on purpose
  // with an ellipsis (a password's hash in one line): meant to be wider than the page.
  const heldByABox = (el) => {
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      const style = getComputedStyle(box), x = style.overflowX;
      if (x === "auto" || x === "scroll") return true;
      if ((x === "hidden" || x === "clip") && style.textOverflow === "ellipsis") return true;
    }
    return false;
  };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (typeof el.className === "string" && el.className.trim() ? "." + el.className.trim().split(/\\s+/).slice(0, 3).join(".") : "");
  const past = new Set();
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height || box.right <= width + 1 || box.right <= 0) continue;
    // Not drawn (a closed <details> keeps the size it had at another width): not seen.
    if (!el.checkVisibility({visibilityProperty: true}) || heldByABox(el)) continue;
    past.add(el);
  }
  // The icons are words drawn by a font ("approval", "key"): not text a person reads; and a
  // <code> is an identifier (a tool's argument, a setting's name), data in any language.
  const visibleText = () => {
    for (const icon of document.querySelectorAll(".material-symbols-outlined, .material-symbols-rounded, code")) icon.textContent = "";
    return document.body.innerText;
  };
  const outermost = [...past].filter((el) => !past.has(el.parentElement));
  return {
    scrollWidth: document.scrollingElement.scrollWidth, width,
    past: outermost.slice(0, 4).map((el) => `${name(el)} (${Math.round(el.getBoundingClientRect().width)} px wide, `
                                           + `right edge at ${Math.round(el.getBoundingClientRect().right)})`),
    pastCount: outermost.length,
    key: document.querySelector(key) !== null,
    lang: document.documentElement.lang,
    text: withText ? visibleText() : "",
  };
}"""


@dataclass(frozen=True)
class OperatorPage:
    name: str  # as the report says it: "changelist delivery.outboundmessage", "console-dashboard", …
    path: str
    key: str  # CSS selector of the element the page is for


def operator_pages(planted) -> list[OperatorPage]:
    """The sidebar's pages, a story, and every registered model's list, a change page and
    the add page where the admin allows adding."""
    pages = [OperatorPage("console-story", reverse("console-story", args=[planted.conversation.pk]),
                          KEY_ELEMENTS["console-story"])]
    for _, entries in navigation.GROUPS:
        for entry in entries:
            name = entry.url_name or f"sidebar {entry.model}" + (f"?{entry.query}" if entry.query else "")
            pages.append(OperatorPage(name, entry.link(), KEY_ELEMENTS.get(entry.url_name, "#result_list"
                                                                           if entry.model else "h1")))
    request = RequestFactory().get("/admin/")
    request.user = User.objects.get(username=planted.operator[0])
    for model, model_admin in admin.site._registry.items():
        label, route = model._meta.label_lower, f"admin:{model._meta.app_label}_{model._meta.model_name}"
        pages.append(OperatorPage(f"changelist {label}", reverse(f"{route}_changelist"), "#result_list"))
        row = model_admin.get_queryset(request).first()
        form = f"form#{model._meta.model_name}_form"
        # A model without a row: its change page cannot be visited; plant one in tests/support/operator_data.py.
        pages.append(OperatorPage(f"change {label}", reverse(f"{route}_change", args=[row.pk]) if row else "", form))
        if model_admin.has_add_permission(request):
            pages.append(OperatorPage(f"add {label}", reverse(f"{route}_add"), form))
    unique = {}
    for page in pages:
        unique.setdefault(page.path or page.name, page)
    return list(unique.values())


def english_words(text: str, planted_texts: list[str]) -> dict[str, str]:
    """{word: where it stands, e.g. '…Estado: «turn» listo…'} for each English domain word."""
    for planted in planted_texts:
        text = text.replace(planted, " ")
    # A word joined to another by '.', '_', ':', '/', '@' or '-' is an identifier (a tool's
    # name, a task's function or slug, an event's kind, a path, a UID), and a word in
    # double quotes a JSON key or value: data, not prose.
    text = re.sub(r"\S*\w[._:/@-]\w\S*|\"\w+\"", " ", text)
    found = {}
    for match in re.finditer(rf"\b(?:{'|'.join(DOMAIN_WORDS)})\b", text, flags=re.IGNORECASE):
        word = match.group()
        if word.lower() not in ALLOWED_IN_SPANISH and word not in found:
            before, after = text[max(0, match.start() - 30):match.start()], text[match.end():match.end() + 30]
            found[word] = " ".join(f"{before}«{word}»{after}".split())
    return found


def server_errors(log: str) -> list[str]:
    """Errors, and a request of the page's refused (django.request's warnings: a 4xx)."""
    return [line.strip() for line in log.splitlines()
            if re.search(r"\b(ERROR|CRITICAL)\b|Traceback|\bWARNING django\.request\b", line)]


def problems_of_serving(response, new_log, new_console) -> list[str]:
    problems = [] if response and response.status == 200 else [f"HTTP {response.status if response else None}"]
    problems += [f"server log: {line[:300]}" for line in server_errors(new_log)[:3]]
    return problems + [f"browser console: {error[:300]}" for error in new_console[:3]
                       if not any(re.search(pattern, error) for pattern in [*ALWAYS_IGNORED, LEFT_WHILE_CONNECTING])]


def problems_of(page, measured, planted_texts) -> list[str]:
    problems = []
    if measured["scrollWidth"] > measured["width"] + 1:
        problems.append(f"scrolls sideways: {measured['scrollWidth']} px wide in {measured['width']}")
    if measured["pastCount"]:
        problems.append(f"{measured['pastCount']} element(s) past the right edge: " + "; ".join(measured["past"]))
    if not measured["key"]:
        problems.append(f"no {page.key}")
    if measured["text"] and page.name not in ENGLISH_BY_DESIGN:
        if measured["lang"] != "es":
            problems.append(f'<html lang="{measured["lang"]}">')
        words = english_words(measured["text"], planted_texts)
        if words:
            problems.append("English in Spanish: " + ", ".join(sorted(words)) + " — "
                            + " | ".join(f"…{words[word]}…" for word in sorted(words)))
    return problems


def visit_all(browser, web, planted, pages) -> tuple[dict, float]:
    """{(page name, width, language): [problem, …]} for every page, and the seconds taken.

    A page is the same HTML at both widths: loaded once per language, measured at the
    width it was loaded at, then at the other (CSS media queries apply on a resize; no
    script of ours or unfold's reads the width when it loads), so the server renders
    each page twice, not four times."""
    found, started, log_seen = {}, time.monotonic(), len(web.output())
    timings.clear()
    widths = list(VIEWPORTS)
    for language in LANGUAGES:
        page = page_for(browser, web.url, *planted.operator, viewport=VIEWPORTS[widths[0]])
        page.context.set_extra_http_headers({"Accept-Language": language})
        for target in pages:
            if not target.path:
                for width in widths:
                    found[(target.name, width, language)] = ["no row to open: plant one in tests/support/operator_data.py"]
                continue
            began, console_seen = time.monotonic(), len(console_errors(page))
            response = page.goto(target.path, wait_until="load")
            loaded = time.monotonic()
            log = web.output()
            served = problems_of_serving(response, log[log_seen:], console_errors(page)[console_seen:])
            log_seen = len(log)
            for width in widths:
                page.set_viewport_size(VIEWPORTS[width])
                # The words once per page, at the width that shows the most of it.
                measured = page.evaluate(MEASURE, [target.key, language == "es" and width == "desktop"])
                found[(target.name, width, language)] = served + problems_of(target, measured, planted.texts)
            widths.reverse()  # the next page loads at the width this one ended at
            timings.append((target.name, language, loaded - began, time.monotonic() - loaded))
            let_network_changes_through(page)  # the test is long: a cluster test's start waits a page, not all
        page.context.close()
    return found, time.monotonic() - started


def kind_of(problem: str) -> str:
    """"HTTP 500", "scrolls sideways", "English in Spanish", …: what a problem is about."""
    if "past the right edge" in problem:
        return "drawn past the right edge"
    return problem.split(":")[0] if problem.startswith("HTTP") else re.sub(r"\d+", "N", problem.split(":")[0])


def write_report(found: dict, pages: list[OperatorPage], seconds: float) -> Path:
    lines = [f"# Operator pages in Chromium: {len(pages)} pages x {len(VIEWPORTS)} widths x {len(LANGUAGES)} "
             f"languages in {seconds:.1f} s", "", "Page views failing, by kind of problem:", ""]
    kinds = Counter(kind for problems in found.values() for kind in {kind_of(problem) for problem in problems})
    lines += [f"- {kind}: {count}" for kind, count in kinds.most_common()] + [""]
    for target in pages:
        rows = [(width, language, problems) for (name, width, language), problems in found.items()
                if name == target.name and problems]
        lines.append(f"- {'FAIL' if rows else 'ok'} {target.name} `{target.path}`")
        lines += [f"    - {width} {language}: {problem}" for width, language, problems in rows for problem in problems]
    lines += ["", "## slowest views (load s, measure s)", ""]
    lines += [f"- {n} {lang}: {a:.2f} {b:.2f}" for n, lang, a, b in sorted(timings, key=lambda t: -t[2] - t[3])[:20]]
    lines.append(f"total load {sum(t[2] for t in timings):.1f} s, measure {sum(t[3] for t in timings):.1f} s")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n")
    return REPORT


@pytest.fixture
def planted(transactional_db):
    return plant()


def test_every_operator_page_holds_at_both_widths_in_english_and_spanish(planted, processes, browser):
    pages = operator_pages(planted)
    web = processes.web()
    found, seconds = visit_all(browser, web, planted, pages)
    report = write_report(found, pages, seconds)
    failing = [f"{name} ({width}, {language}): {'; '.join(problems)}"
               for (name, width, language), problems in found.items() if problems]
    print(f"{len(pages)} pages x 4 in {seconds:.1f} s; report: {report}")
    assert not failing, f"{len(failing)} of {len(found)} page views fail (all of them in {report}):\n" + \
        "\n".join(failing[:60])
