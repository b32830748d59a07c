"""Approved templates: what a platform with a reply window (WhatsApp's 24 hours) takes
from a business outside it. A ledger row that carries one (`OutboundMessage.template`)
goes out as that template, filled with the row's text, instead of as free text.

The row keeps the template as it is sent: {"name", "language", "parameters"} (the body's
text parameters, {{1}}, {{2}}, …, in order). How a text fills them is the *fill*:

- `text`: the whole text is {{1}};
- `lines`: each non-empty line is one parameter ({{1}} the first line, {{2}} the next…).

A parameter is one line: WhatsApp refuses new lines, tabs and more than four spaces in a
row in one (error 132018), so runs of white space become one space. A resend that may
repeat a delivered message carries the recovery marker in front of {{1}} (a template's
fixed text cannot be labelled), so a possible duplicate is labelled here too.
"""

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.utils.translation import gettext

FILL_TEXT, FILL_LINES = "text", "lines"
FILLS = (FILL_TEXT, FILL_LINES)
# WhatsApp Manager's names: lower case letters, digits and underscores; languages as
# Meta spells them: "es", "en_US", "pt_BR", "fil".
_NAME = re.compile(r"[a-z0-9_]{1,512}")
_LANGUAGE = re.compile(r"[a-z]{2,3}(_[A-Z]{2})?")


def check_name(value: object) -> str:
    value = str(value).strip()
    if not _NAME.fullmatch(value):
        raise ValidationError(gettext("a template's name as WhatsApp Manager shows it: lower-case letters, digits "
                                      "and underscores (e.g. appointment_reminder)"))
    return value


def check_language(value: object) -> str:
    value = str(value).strip()
    if not _LANGUAGE.fullmatch(value):
        raise ValidationError(gettext("a template language code as Meta writes it: es, en_US, pt_BR…"))
    return value


def check_fill(value: str) -> str:
    if value not in FILLS:
        raise ValidationError(gettext("one of %(choices)s") % {"choices": ", ".join(FILLS)})
    return value


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def parameters(text: str, fill: str) -> list[str]:
    """The body parameters `text` fills (at least one: an empty text is refused upstream)."""
    if fill == FILL_LINES:
        found = [one_line(line) for line in str(text).splitlines()]
        return [line for line in found if line] or [one_line(text)]
    return [one_line(text)]


def filled(name: str, language: str, text: str, fill: str) -> dict[str, Any]:
    """The template a row carries: checked, and filled with `text`."""
    return {"name": check_name(name), "language": check_language(language),
            "parameters": parameters(text, check_fill(fill))}


def labelled(template: dict[str, Any], label: str) -> dict[str, Any]:
    """The template with the recovery marker (`label`, "" for none) in front of {{1}}."""
    values = list(template.get("parameters") or [])
    if not label or not values:
        return template
    return {**template, "parameters": [one_line(f"{label} {values[0]}"), *values[1:]]}


def shown(template: dict[str, Any]) -> str:
    """One line for operators: name (language) and its parameters."""
    if not template:
        return ""
    values = " | ".join(template.get("parameters") or [])
    return f"{template.get('name')} ({template.get('language')}): {values}"
