"""A question among the ledger's rows — asking the user to confirm an action — goes out
with its answer buttons while its proposal is open (tools.confirmations decides which
rows those are). Tools sits above delivery, so the ledger asks through the interface it
owns here, the implementation named by settings.AGENTLOOP_QUESTION_BUTTONS and resolved
by agentloop.core.plugins (docs/architecture.md, "Pointing up")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from agentloop.core import plugins

# (label, opaque callback data) pairs, in the order shown.
Buttons = tuple[tuple[str, str], ...]


class QuestionButtons(Protocol):
    def __call__(self, row_ids: Iterable[int]) -> dict[int, Buttons]:
        """{ledger row id: its buttons} for the questions among these rows still waiting
        for an answer; rows that are no such question are left out."""
        ...


def buttons_for_rows(row_ids: Iterable[int]) -> dict[int, Buttons]:
    source: QuestionButtons = plugins.named("AGENTLOOP_QUESTION_BUTTONS")
    return source(row_ids)
