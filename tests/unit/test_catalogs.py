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
    untranslated = not_ready(entries)
    assert not untranslated, f"untranslated or fuzzy in locale/{language}/LC_MESSAGES/{domain}.po: {untranslated}"


def not_ready(entries) -> list:
    """The msgids a language does not have yet: an empty msgstr (or plural form), or a fuzzy
    one (makemessages' guess from a similar text, never shown)."""
    return sorted(msgid for msgid, (msgstr, flags) in entries.items() if not translated(msgstr) or "fuzzy" in flags)


def test_an_empty_a_fuzzy_and_a_half_plural_entry_are_not_ready(tmp_path):
    """Not vacuous: what makemessages adds for a new text, and what it guesses, fail the check."""
    (tmp_path / "django.po").write_text(
        'msgid "Done"\nmsgstr "Hecho"\n\n'
        'msgid "New text"\nmsgstr ""\n\n'
        '#, fuzzy\nmsgid "Guessed"\nmsgstr "Adivinado"\n\n'
        'msgid "%(n)d row"\nmsgid_plural "%(n)d rows"\nmsgstr[0] "%(n)d fila"\nmsgstr[1] ""\nmsgstr[2] ""\n')
    assert not_ready(po_entries(tmp_path / "django.po")) == ["%(n)d row", "Guessed", "New text"]


def test_the_scripts_mark_their_texts():
    """The console's scripts' texts are found (the check above is not vacuous)."""
    assert {"Apply", "Reject", "live", "Merged %(count)s message into %(turn)s"} <= marked_script_msgids()


def compiled_entries(path) -> dict:
    """{msgid: msgstr, or the tuple of a plural entry's forms} of a .mo file (its header left out)."""
    with open(path, "rb") as compiled:
        found = gettext.GNUTranslations(compiled)._catalog  # type: ignore[attr-defined]
    entries: dict = {}
    for key, text in found.items():
        if isinstance(key, tuple):  # (msgid, n): a plural form
            forms = entries.setdefault(key[0], {})
            forms[key[1]] = text
        elif key:
            entries[key] = text
    return {msgid: tuple(text[n] for n in sorted(text)) if isinstance(text, dict) else text
            for msgid, text in entries.items()}


def stale_entries(po, mo) -> list:
    """The msgids a .mo does not hold as its .po says: missing, different (any plural
    form) or gone from the .po."""
    expected = {msgid: msgstr for msgid, (msgstr, flags) in po_entries(po).items()
                if translated(msgstr) and "fuzzy" not in flags}  # msgfmt leaves those two out
    compiled = compiled_entries(mo)
    return sorted(msgid for msgid in expected.keys() | compiled.keys() if expected.get(msgid) != compiled.get(msgid))


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_compiled_catalog_is_the_po_file(language, domain):
    """The committed .mo holds exactly what its .po says — every entry, every plural form,
    nothing the .po no longer has: a .po edited or regenerated without compilemessages (a
    .mo older than its .po) fails. Judged by content: git keeps no file times, so a fresh
    checkout's .mo may look older or newer than its .po whatever it holds."""
    stale = stale_entries(catalog(language) / f"{domain}.po", catalog(language) / f"{domain}.mo")
    assert not stale, f"locale/{language}/LC_MESSAGES/{domain}.mo is stale: run compilemessages: {stale}"


def test_a_po_file_changed_after_its_compiled_catalog_is_caught(tmp_path):
    """Not vacuous: the committed es .mo against its .po with one entry changed and one added."""
    edited = (catalog("es") / "django.po").read_text().replace('msgstr "canal"', 'msgstr "canal (nuevo)"', 1)
    (tmp_path / "django.po").write_text(edited + '\nmsgid "A text marked later"\nmsgstr "Un texto marcado después"\n')
    assert stale_entries(tmp_path / "django.po", catalog("es") / "django.mo") == ["A text marked later", "channel"]


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
