"""How the admin shows what people and agents wrote, and the few values an operator reads
at a glance (issue 53: one 10,000-character message made a conversation's page 23,806 px
wide, and squeezed every list's reply column to 60 px).

- A list's cell shows a text's start (`cell`), linked to the row's page where it is whole:
  a list is for scanning, never for reading a whole message.
- An inline shows its start with the whole behind a <details> toggle (`toggle`): an inline
  row has no page of its own worth leaving the parent's for.
- A page shows it whole (`whole`), wrapped anywhere: a text with no space in it (a URL, a
  token, "xxxx…") must wrap too, or it sets the page's width.
- `TextsHold` (a ModelAdmin's or an inline's base) brings texts.css, which wraps every
  read-only field that way.

Also: a count painted only when it is not zero (`count`), a moment as "in 1 day" or
"3 hours ago" (`relative`), a tool's arguments as "name: value" lines (`pairs`).
"""

import json
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import avoid_wrapping, format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import TIME_STRINGS
from django.utils.translation import gettext

# A list's cell: about a line of the list at 1440 px beside six other columns.
CELL_CHARS = 80
# An inline's summary line: the start of a message, enough to tell two apart.
TOGGLE_CHARS = 120
# A contact's or conversation's name in a list or a link: a name, not a paragraph.
NAME_CHARS = 60

CSS = "admin_texts/texts.css"


class TextsHold:
    """A ModelAdmin's or an inline's base: its pages load texts.css (read-only fields and
    our cells wrap anywhere, so no text widens a page)."""

    class Media:
        css = {"all": [CSS]}


def cut(text: str | None, length: int = CELL_CHARS) -> str:
    """The text's first `length` characters, "…" when there was more; one line."""
    return Truncator(" ".join((text or "").split())).chars(length)


def name(text: str | None, length: int = NAME_CHARS) -> SafeString:
    """A name in a list's cell (a contact, a conversation): cut, and wrapped anywhere."""
    return format_html('<span class="al-name">{}</span>', cut(text, length) or "—")


def cell(text: str | None, url: str | None = None, length: int = CELL_CHARS) -> SafeString:
    """A list's cell: the text's start; when cut, a link to `url` (the row's page) where it
    is whole."""
    short = cut(text, length)
    if url and short != " ".join((text or "").split()):
        return format_html('<a class="al-cell" href="{}" title="{}">{}</a>', url, gettext("Read the whole text"),
                           short)
    return format_html('<span class="al-cell">{}</span>', short or "—")


def toggle(text: str | None, length: int = TOGGLE_CHARS) -> SafeString:
    """An inline's text: its start, and the whole behind a toggle when it was cut."""
    text = text or ""
    short = cut(text, length)
    if short == " ".join(text.split()):
        return format_html('<div class="al-whole">{}</div>', text or "—")
    return format_html('<details class="al-toggle"><summary>{}</summary><div class="al-whole">{}</div></details>',
                       short, text)


def whole(text: str | None) -> SafeString:
    """A page's text, whole: line breaks kept, wrapped anywhere."""
    return format_html('<div class="al-whole">{}</div>', text or "—")


def tones(choices: Any, **painted: str) -> dict[str, str]:
    """unfold's `@display(label=…)` colours for every state of `choices`: those named
    painted, the rest plain. Every state must be there: unfold shows a state it does not
    find as its raw value ("done", "agent") instead of its translated label."""
    return {value: painted.get(value, "") for value in choices.values}


def count(number: int, tone: str = "danger") -> SafeString:
    """A count of things gone wrong (failed, abandoned): painted `tone` only when there is
    one. A zero is the calm case, and painted it reads as an alarm."""
    if not number:
        return format_html('<span class="al-count">{}</span>', number)
    return format_html('<span class="al-count al-{}">{}</span>', tone, number)


# The units a moment is told in, largest first, with Django's own (translated) words.
UNITS = [("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400), ("hour", 3600),
         ("minute", 60)]


def duration(seconds: float) -> str:
    """"1 day", "3 hours": the largest unit the span nearly fills, rounded to it — a
    proposal made a day ahead reads "1 day" a second later, not "23 hours" (Django's
    timeuntil cuts down). Below a minute: "0 minutes", as Django says it."""
    seconds = abs(seconds)
    for unit, length in UNITS:
        if seconds >= length * 0.9:
            return avoid_wrapping(TIME_STRINGS[unit] % {"num": round(seconds / length)})
    return avoid_wrapping(TIME_STRINGS["minute"] % {"num": round(seconds / 60)})


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """"in 1 day", "3 hours ago", in the operator's language."""
    if moment is None:
        return "—"
    seconds = (moment - (now or timezone.now())).total_seconds()
    if seconds >= 0:
        return gettext("in %(duration)s") % {"duration": duration(seconds)}
    return gettext("%(duration)s ago") % {"duration": duration(seconds)}


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_value(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)  # nested: rare; written as is, every letter readable
    return "—" if value is None or value == "" else str(value)


def pairs(arguments: dict[str, Any] | None) -> SafeString:
    """A tool's arguments as "name: value" lines, whole (an operator approves what they
    read: every recipient of an email, its whole body)."""
    if not arguments:
        return format_html('<span class="al-cell">{}</span>', "—")
    lines = format_html_join("", '<div class="al-pair"><dt>{}</dt><dd>{}</dd></div>',
                             ((name, _value(value)) for name, value in arguments.items()))
    return format_html('<dl class="al-pairs">{}</dl>', lines)


def pairs_line(arguments: dict[str, Any] | None, url: str | None = None, length: int = CELL_CHARS) -> SafeString:
    """A list's cell of a tool's arguments: "name: value, name: value", cut."""
    line = "; ".join(f"{name}: {_value(value)}" for name, value in (arguments or {}).items())
    return cell(line, url, length)

