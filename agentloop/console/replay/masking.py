"""Personal data in a recording replaced by stable stand-ins (`--mask`): names, platform
ids and phone numbers. Stable, so the recording still says which message an edit
corrects and that two messages came from the same person; the texts keep their length
roughly, so the windows a replay gives them are the ones they got."""

from __future__ import annotations

import re

# A phone number as people type it: +56 9 1234 5678, (02) 2345-6789, 912345678 — never a
# date or a time ("2026-12-01 10:00" must keep its meaning for the agent).
PHONE = re.compile(r"\+\d[\d .()-]{6,}\d|\(?\b\d{2,4}\)?[ -]\d{3,4}[ -]\d{4}\b|\b\d{8,}\b")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")


def _digits(text: str) -> int:
    return sum(c.isdigit() for c in text)


class Masker:
    """One recording's stand-ins: each distinct value gets its own, the same every time."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.seen: dict[tuple[str, str], str] = {}

    def stand_in(self, kind: str, value: str) -> str:
        """`value` (a name, an id) as `<kind>-N`; empty stays empty."""
        if not self.enabled or not value:
            return value
        return self.seen.setdefault((kind, value), f"{kind}-{sum(k == kind for k, _ in self.seen) + 1}")

    def text(self, value: str) -> str:
        """A text with the names already met, phone numbers and e-mail addresses masked."""
        if not self.enabled or not value:
            return value
        for (kind, original), replacement in self.seen.items():
            if kind == "person" and len(original) >= 3:
                value = re.sub(rf"\b{re.escape(original)}\b", replacement, value, flags=re.IGNORECASE)
        value = EMAIL.sub("person@example.com", value)
        return PHONE.sub(lambda m: "[phone]" if _digits(m.group(0)) >= 7 else m.group(0), value)
