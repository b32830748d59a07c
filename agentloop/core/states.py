"""One checked transition per state machine.

A model's states are an enum and its TRANSITIONS table ({old: {new, …}}, every state of
the enum a key, terminal ones mapping to nothing). `Model.transition(...)` is the only
way a row changes state: it refuses a move the table does not allow (a bug, raised at
once, not a race) and performs it as a compare-and-swap `filter(pk, state__in=old)
.update(state=new, …)`, so of two racing callers exactly one moves the row.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from django.db.models import Case, CharField, Q, Value, When

from agentloop.core.redaction import redact

if TYPE_CHECKING:
    from django.db.models import Manager


class IllegalTransition(ValueError):
    """A transition the model's TRANSITIONS table does not allow."""


class StateMachine:
    """Mixin for a model with a `state` field and a TRANSITIONS table."""

    TRANSITIONS: ClassVar[Mapping[str, Collection[str]]] = {}
    objects: ClassVar[Manager[Any]]  # declared only: the model's own manager

    @classmethod
    def check_transition(cls, old_states: Iterable[str], new_states: Collection[str]) -> None:
        """Raise IllegalTransition unless every old → new pair is in the table (for the
        few statements written in SQL by hand, which call this before they run)."""
        for old in old_states:
            for new in new_states:
                if new not in cls.TRANSITIONS.get(old, ()):
                    raise IllegalTransition(f"{cls.__name__}: {old} → {new} is not an allowed transition")

    @classmethod
    def transition(cls, pk: int | Collection[int], old: str | Iterable[str], new: str | dict[int, str], *,
                   where: Q | dict[str, Any] | None = None, **fields: Any) -> int:
        """Move the row `pk` (or the rows, given a list of ids) from one of the states
        `old` (a state or several) to `new` — a state, or {id: state} to decide per row
        in one UPDATE — where `where` (a Q or a dict of filters) also holds, setting
        `fields` too. Returns how many rows moved (0: another caller got there first)."""
        olds = [old] if isinstance(old, str) else list(old)
        news = set(new.values()) if isinstance(new, dict) else {new}
        cls.check_transition(olds, news)
        for name in ("error", "outcome", "last_error"):  # stored error texts never keep a secret
            if isinstance(fields.get(name), str):
                fields[name] = redact(fields[name])
        rows = cls.objects.filter(state__in=olds)
        rows = rows.filter(pk__in=list(pk)) if isinstance(pk, (list, tuple, set, frozenset)) else rows.filter(pk=pk)
        if isinstance(where, Q):
            rows = rows.filter(where)
        elif where:
            rows = rows.filter(**where)
        if isinstance(new, dict):
            if not new:
                return 0
            per_row = Case(*(When(pk=key, then=Value(state)) for key, state in new.items()), output_field=CharField())
            return rows.update(state=per_row, **fields)
        return rows.update(state=new, **fields)
