"""Deleting old rows in bounded batches, without long locks (the retention sweep,
conversations/retention.py, and the ledger's prune).

A table is walked from its oldest rows (its primary key, which grows with its time
stamp) in windows of `batch` ids; the walk stops at the first window that starts at a
row younger than the cutoff, so a sweep never reads the young part of a table. Each
window's deletable rows (the caller's condition: what no guarantee still needs) are
taken FOR UPDATE SKIP LOCKED (PostgreSQL: a row some other transaction holds is left for
the next sweep, never waited for; SQLite's writers take turns anyway) and deleted in
that one short transaction: the condition is checked on rows nobody else can change
before the delete, so a row that stops being deletable meanwhile (an operator's retry of
an abandoned reply) is kept. Between batches the sweep sleeps `pause` seconds, so the
hot path's writers get the lock in between.
"""

import time
from dataclasses import dataclass, field

from django.db import transaction


@dataclass
class Budget:
    """How far one sweep may go: a deadline (time.monotonic()), rows per batch, the pause."""

    deadline: float
    batch: int = 500
    pause: float = 0.002
    deleted: dict = field(default_factory=dict)

    def left(self) -> bool:
        return time.monotonic() < self.deadline


def delete_old(model, stamp, cutoff, deletable, budget, on_delete=None) -> int:
    """Delete the rows of `model` whose `stamp` is before `cutoff` and that `deletable`
    (a queryset of the model) holds, oldest first, `budget.batch` at a time, until none is
    left or the budget is spent. `on_delete(ids)` runs in each batch's transaction just
    before its delete (e.g. to read the files they name and delete them on commit).
    Returns the count."""
    last, total = 0, 0
    while budget.left():
        window = list(model.objects.filter(pk__gt=last).order_by("pk").values_list("pk", stamp)[:budget.batch])
        if not window or window[0][1] >= cutoff:
            break
        last = window[-1][0]
        old = [pk for pk, at in window if at < cutoff]
        with transaction.atomic():
            ids = list(deletable.filter(pk__in=old).select_for_update(skip_locked=True, of=("self",))
                       .order_by().values_list("pk", flat=True))
            if ids:
                if on_delete:
                    on_delete(ids)
                model.objects.filter(pk__in=ids).delete()
        total += len(ids)
        time.sleep(budget.pause)
    budget.deleted[model._meta.label] = budget.deleted.get(model._meta.label, 0) + total
    return total
