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
an abandoned reply) is kept. Rows are deleted by primary key without being loaded
(delete_rows). After each batch the sweep rests as long as the batch took, so the hot
path's writers get the lock and a core in between; on SQLite the write-ahead log is
copied back between batches, outside the write lock. docs/operations.md#retention has
the measurements behind each of these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connection, transaction
from django.db.models import CASCADE, DO_NOTHING, SET_NULL, signals
from django.db.models.deletion import get_candidate_relations_to_delete

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet
    from django.db.models.fields.reverse_related import ForeignObjectRel
    from django.db.models.options import Options

# What runs in a batch's transaction just before its delete, given the batch's ids.
OnDelete = Callable[[list[int]], object]


@dataclass
class Budget:
    """How far one sweep may go: a deadline (time.monotonic()), rows per batch, the pause
    after each batch: `rest` times as long as the batch took, at least `pause` seconds.
    Resting as long as it worked keeps the sweep (its process and its database backend)
    to about half a core: at full speed it took one of two cores from the web process,
    and the p99 admission latency doubled on both databases (tests/bench/retention.py)."""

    deadline: float
    batch: int = 500
    pause: float = 0.002
    rest: float = 1.0
    deleted: dict[str, int] = field(default_factory=dict)  # model label -> rows deleted

    def left(self) -> bool:
        return time.monotonic() < self.deadline


def delete_old(model: type[Model], stamp: str, cutoff: datetime, deletable: QuerySet[Any], budget: Budget, *,
               on_delete: OnDelete | None = None) -> int:
    """Delete the rows of `model` whose `stamp` is before `cutoff` and that `deletable`
    (a queryset of the model) holds, oldest first, `budget.batch` at a time, until none is
    left or the budget is spent. `on_delete(ids)` runs in each batch's transaction just
    before its delete (e.g. to read the files they name and delete them on commit).
    Returns the count."""
    walk = _Walk(model, stamp, cutoff, deletable, on_delete)
    last, total = 0, 0
    with _checkpoints_outside_the_lock() as after_batch:
        while budget.left():
            batch = walk.batch(last, budget.batch)
            if batch is None:
                break
            last, deleted, took = batch
            total += deleted
            after_batch()
            time.sleep(max(budget.pause, budget.rest * took))
    budget.deleted[model._meta.label] = budget.deleted.get(model._meta.label, 0) + total
    return total


@dataclass
class _Walk:
    """One table's walk from its oldest rows (delete_old's arguments)."""

    model: type[Model]
    stamp: str
    cutoff: datetime
    deletable: QuerySet[Any]
    on_delete: OnDelete | None

    def batch(self, last: int, size: int) -> tuple[int, int, float] | None:
        """The window of `size` ids after `last`, its deletable rows deleted in one
        transaction: (its last id, the rows deleted, the seconds it took); None past the
        old rows."""
        began = time.monotonic()
        window = list(self.model._default_manager.filter(pk__gt=last).order_by("pk").values_list("pk", self.stamp)[:size])
        if not window or window[0][1] >= self.cutoff:
            return None
        check = _check(self.deletable, [pk for pk, at in window if at < self.cutoff])
        with transaction.atomic():
            ids = check()
            if ids:
                if self.on_delete:
                    self.on_delete(ids)
                delete_rows(self.model, ids)
        return window[-1][0], len(ids), time.monotonic() - began


CHECKPOINT_EVERY = 10  # batches


@contextmanager
def _checkpoints_outside_the_lock() -> Iterator[Callable[[], None]]:
    """On SQLite, while a sweep deletes, its commits never copy the write-ahead log back
    into the database (wal_autocheckpoint=0 on its connection): that copy ran inside the
    commit, so inside the write lock, every ~1,000 pages (16-70 ms). It runs instead
    every CHECKPOINT_EVERY batches, after the commit (PASSIVE: writers go on meanwhile),
    keeping the log short, so the web's own commits do not meet a long one to copy."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:  # inside a transaction: no checkpoint
        yield lambda: None
        return
    batches = 0

    def after_batch() -> None:
        nonlocal batches
        batches += 1
        if batches % CHECKPOINT_EVERY == 0:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")

    with connection.cursor() as cursor:
        before = cursor.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        cursor.execute("PRAGMA wal_autocheckpoint=0")
    try:
        yield after_batch
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA wal_autocheckpoint={int(before)}")
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _check(deletable: QuerySet[Any], ids: list[int]) -> Callable[[], list[int]]:
    """A callable, run in the batch's transaction: the rows among `ids` that `deletable`
    holds (locked on PostgreSQL, skipping those another transaction holds). On SQLite its
    SQL is built before the write lock is taken, and reads the table by primary key only
    (NOT INDEXED): without statistics its planner preferred an index on a condition
    column (the ledger's state), reading every delivered row for each batch — 6 ms per
    batch at 50,000 rows, growing with the table — inside the write lock."""
    query = (deletable.filter(pk__in=ids).select_for_update(skip_locked=True, of=("self",)).order_by()
             .values_list("pk", flat=True))
    if connection.vendor != "sqlite":
        return lambda: list(query)
    sql, params = by_primary_key(query)

    def run() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [pk for (pk,) in cursor.fetchall()]
    return run


def by_primary_key(query: QuerySet[Any, Any]) -> tuple[str, tuple[Any, ...]]:
    """`query`'s SQLite statement with its table read by primary key alone (NOT INDEXED
    on the outer FROM, the first in the statement: the select list is the key alone);
    the indexes of joined and sub-queried tables stay usable."""
    sql, params = query.query.sql_with_params()
    table = connection.ops.quote_name(query.model._meta.db_table)
    head, outer, tail = sql.partition(f" FROM {table} ")
    if not outer or "(" in head or " FROM " in head:  # a sub-query before the outer FROM
        raise ValueError(f"not a plain query of {table}: {sql[:200]}")
    return f"{head}{outer}NOT INDEXED {tail}", params


def delete_rows(model: type[Model], ids: Sequence[int]) -> None:
    """Delete these rows by primary key, doing first what each foreign key to them asks
    (CASCADE: the rows referring to them, the same way; SET_NULL: the reference cleared)
    without loading a model instance. Django's own delete() loads every row of a model
    that others refer to, and ran 4x longer than the SQL inside each batch's transaction
    (SQLite's one write lock: the admissions waited). What this does not know (signals,
    PROTECT, a foreign key to another field, generic relations, inherited models) goes
    through Django's delete()."""
    if not _plain(model):
        model._base_manager.filter(pk__in=ids).delete()
        return
    for relation in _relations_to(model._meta):
        field = relation.field
        referring = relation.related_model._base_manager.filter(**{f"{field.name}__in": ids})
        if field.remote_field.on_delete is CASCADE:
            children = list(referring.values_list("pk", flat=True))
            if children:
                delete_rows(relation.related_model, children)
        elif field.remote_field.on_delete is SET_NULL:
            referring.update(**{field.name: None})
    column = cast(str, model._meta.pk.column)  # a primary key is concrete: it has a column
    table, pk = connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(column)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {pk} IN ({', '.join(['%s'] * len(ids))})", list(ids))


def _plain(model: type[Model], seen: frozenset[type[Model]] = frozenset()) -> bool:
    """Whether delete_rows may delete `model`'s rows itself: no delete signal listens, no
    parent table, no generic relation, and every foreign key to it points at its primary
    key and cascades (to a model of which the same holds), sets null or does nothing."""
    opts = model._meta
    if opts.parents or any(hasattr(f, "bulk_related_objects") for f in opts.private_fields):
        return False
    if signals.pre_delete.has_listeners(model) or signals.post_delete.has_listeners(model):
        return False
    for relation in _relations_to(opts):
        on_delete = relation.field.remote_field.on_delete
        if on_delete not in (CASCADE, SET_NULL, DO_NOTHING) or not relation.field.target_field.primary_key:
            return False
        child = relation.related_model
        if on_delete is CASCADE and child not in seen and not _plain(child, seen | {model}):
            return False
    return True


def _relations_to(opts: Options[Any]) -> Iterable[ForeignObjectRel]:
    """The relations a delete of `opts`' rows must follow (Django's own list). They are
    reverse relations: django-stubs types them as fields."""
    return cast("Iterable[ForeignObjectRel]", get_candidate_relations_to_delete(opts))
