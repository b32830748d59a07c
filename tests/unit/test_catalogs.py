"""No text of ours reaches a user outside a catalog: every msgid the product marks
(`_("…")`, gettext, gettext_lazy, in .py and templates) is in each catalog of locale/,
translated; so is every text the console's scripts mark (gettext/ngettext in static/*.js,
the djangojs catalogs served by /console/jsi18n/); the committed .mo files say what their
.po files say; and nothing writes an English literal into the ledger (ledger.enqueue /
Reply take a catalog text or what an agent or a person wrote). No database, no processes:
the sources are parsed."""

import ast
import gettext
import json
import re
from pathlib import Path

import pytest
from django.conf import settings

BASE_DIR = next(p for p in Path(__file__).resolve().parents if (p / "manage.py").exists())
APPS = ("agentloop", "conversations", "delivery", "tools", "audit")
MARKERS = {"_", "gettext", "gettext_lazy", "pgettext", "pgettext_lazy"}
TEMPLATE_MARKS = re.compile(r"""{%\s*(?:translate|trans)\s+(["'])(.*?)\1""")
# A script's marked text: gettext("…") or ngettext("…", "…", n) with double-quoted literals.
JS_STRING = r'"((?:[^"\\\n]|\\.)*)"'
JS_MARKS = re.compile(rf"\b(?:gettext|ngettext)\(\s*{JS_STRING}")
LANGUAGES = [code for code, _ in settings.LANGUAGES]


def sources():
    for app in APPS:
        yield from (p for p in (BASE_DIR / app).rglob("*.py") if "migrations" not in p.parts)


def marked_msgids() -> set:
    found = set()
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in MARKERS
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    for path in [*(BASE_DIR / "templates").rglob("*.html"), *BASE_DIR.glob("*/templates/**/*.html")]:
        found.update(match[2] for match in TEMPLATE_MARKS.finditer(path.read_text()))
    return found


def marked_script_msgids() -> set:
    """The msgids static/**/*.js marks (ngettext's singular: its entry's key)."""
    found = set()
    for path in (BASE_DIR / "static").rglob("*.js"):
        found.update(json.loads(f'"{match[1]}"') for match in JS_MARKS.finditer(path.read_text()))
    return found


def po_entries(path) -> dict:
    """{msgid: (msgstr, flags)} of a .po file (the header left out); a plural entry's
    msgstr is the tuple of its forms."""
    entries = {}
    for block in path.read_text().strip().split("\n\n"):
        parts, key, flags = {}, None, ""
        for line in block.splitlines():
            found = re.match(r'^(msgid|msgid_plural|msgstr(?:\[\d+\])?) (".*")$', line)
            if found:
                key = found[1]
                parts.setdefault(key, []).append(ast.literal_eval(found[2]))
            elif line.startswith('"') and key:
                parts[key].append(ast.literal_eval(line))
            elif line.startswith("#,"):
                flags += line
        msgid = "".join(parts.get("msgid", []))
        forms = tuple("".join(texts) for name, texts in parts.items() if name.startswith("msgstr["))
        if msgid:
            entries[msgid] = (forms if forms else "".join(parts.get("msgstr", [])), flags)
    return entries


def translated(msgstr) -> bool:
    return all(msgstr) if isinstance(msgstr, tuple) else bool(msgstr)


def catalog(language):
    return BASE_DIR / "locale" / language / "LC_MESSAGES"


# Each catalog and the texts it must hold: the server's, and the console's scripts'.
DOMAINS = {"django": marked_msgids, "djangojs": marked_script_msgids}


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("language", LANGUAGES)
def test_every_marked_text_is_in_the_catalog_translated(language, domain):
    entries = po_entries(catalog(language) / f"{domain}.po")
    missing = sorted(DOMAINS[domain]() - set(entries))
    assert not missing, (f"not in locale/{language}/LC_MESSAGES/{domain}.po: run makemessages "
                         f"(docs/languages.md): {missing}")
    untranslated = sorted(msgid for msgid, (msgstr, flags) in entries.items()
                          if not translated(msgstr) or "fuzzy" in flags)
    assert not untranslated, f"untranslated or fuzzy in locale/{language}/LC_MESSAGES/{domain}.po: {untranslated}"


def test_the_scripts_mark_their_texts():
    """The console's scripts' texts are found (the check above is not vacuous)."""
    assert {"Apply", "Reject", "live", "Merged %(count)s message into %(turn)s"} <= marked_script_msgids()


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_compiled_catalog_is_the_po_file(language, domain):
    with open(catalog(language) / f"{domain}.mo", "rb") as compiled:
        translations = gettext.GNUTranslations(compiled)
    stale = [msgid for msgid, (msgstr, _flags) in po_entries(catalog(language) / f"{domain}.po").items()
             if not isinstance(msgstr, tuple) and translations.gettext(msgid) != msgstr
             or isinstance(msgstr, tuple) and translations.ngettext(msgid, msgid, 1) != msgstr[0]]
    assert not stale, f"locale/{language}/LC_MESSAGES/{domain}.mo is stale: run compilemessages: {stale}"


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_recovery_sign_comes_first_in_every_language(language):
    marker = "♻️ Recovered reply — this may repeat a message you already received."
    assert po_entries(catalog(language) / "django.po")[marker][0].startswith("♻️ ")


def test_nothing_writes_a_literal_into_the_ledger():
    """A text of ours goes to a user as a catalog text: ledger.enqueue(conversation, text)
    and ledger.Reply(conversation, text) never get a string literal or an f-string."""
    literals = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("enqueue", "Reply") and len(node.args) >= 2):
                continue
            text = node.args[1]
            if isinstance(text, ast.JoinedStr) or (isinstance(text, ast.Constant) and isinstance(text.value, str)
                                                   and text.value.strip()):
                literals.append(f"{path.relative_to(BASE_DIR)}:{node.lineno}")
    assert not literals, f"English written straight to users (mark it with gettext): {literals}"
