"""An event's target ("turn 12", "ledger row 7"), recorded in English as data, named in the
reader's language where a person reads it (the admin's lists and titles)."""

import re

from django.utils.translation import gettext_lazy as _

TARGET_WORDS = {"turn": _("turn"), "claim": _("claim"), "proposal": _("proposal"), "ledger row": _("ledger row"),
                "conversation": _("conversation"), "contact": _("contact"), "message": _("message"),
                "buffer": _("buffer"), "schedule": _("schedule"), "channel": _("channel"), "key": _("key")}
TARGET = re.compile(rf"^({'|'.join(TARGET_WORDS)}) (.+)$")


def target_words(target: str) -> str:
    """"turn 12" → "turno 12": the recorded word in the reader's language, the id as it is."""
    match = TARGET.match(target or "")
    return f"{TARGET_WORDS[match[1]]} {match[2]}" if match else target
