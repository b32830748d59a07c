"""Model instances from hand-written SQL, for the few statements on the timed path (the
flusher's claim, the ready-turn query, a turn's history): the ORM compiles a query anew
on every call, which there cost more than the database did. The columns are listed from the model once; each value goes
through the same converters the ORM applies (SQLite's naive datetimes made aware, JSON
text decoded), so an instance built here is the one a queryset would have given.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connection
from django.db.models import (
    AutoField,
    BigAutoField,
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    Expression,
    Field,
    FloatField,
    ForeignKey,
    ForeignObjectRel,
    IntegerField,
    Model,
    OneToOneField,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SlugField,
    SmallIntegerField,
    TextField,
)
from django.db.models.lookups import In
from django.utils import timezone
from django.utils.dateparse import parse_datetime

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.expressions import Col
    from django.db.models.sql.compiler import SQLCompiler, _AsSqlType

    _In = In[Any]  # generic in django-stubs only
else:
    _In = In

M = TypeVar("M", bound=Model)


class Columns:
    """The concrete columns of `model` (or just `only`, the rest left deferred) under
    `alias`: `.sql` for a SELECT list, `.build(values)` for an instance."""

    def __init__(self, model: type[Model], alias: str, only: frozenset[str] | None = None) -> None:
        fields = [f for f in model._meta.concrete_fields if only is None or f.attname in only]
        self.model, self.names = model, [f.attname for f in fields]
        quote = connection.ops.quote_name
        self.sql = ", ".join(f"{alias}.{quote(_db_column(f))}" for f in fields)
        self.width = len(fields)
        self.converters: list[tuple[int, Col, list[Callable[..., Any]]]] = []
        for index, field in enumerate(fields):
            col = field.get_col(alias)
            chain = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if chain:
                self.converters.append((index, col, chain))

    def build(self, values: Iterable[Any]) -> Model:
        values = list(values)
        for index, col, chain in self.converters:
            for convert in chain:
                values[index] = convert(values[index], col, connection)
        return self.model.from_db(connection.alias, self.names, values)


@functools.lru_cache(maxsize=64)  # a handful of call sites, each with fixed arguments
def columns(model: type[Model], alias: str, only: frozenset[str] | None = None) -> Columns:
    """`Columns` for (model, alias, only), made once per process. `only`: a frozenset of
    attnames, or None for all."""
    return Columns(model, alias, only)


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], name: str) -> str:
    return connection.ops.quote_name(_db_column(model._meta.get_field(name)))


def _db_column(field: Field[Any, Any] | ForeignObjectRel) -> str:
    """The field's column (a concrete field always has one; django-stubs types it optional)."""
    if isinstance(field, ForeignObjectRel) or field.column is None:
        raise ValueError(f"{field} has no column of its own")
    return field.column


def aware(value: datetime | str | None) -> datetime | None:
    """A datetime from raw SQL, as the ORM would have given it: SQLite hands back naive
    UTC (or, for an aggregate, the stored text); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        text, value = value, parse_datetime(value)
        if value is None:
            raise ValueError(f"{text!r} is not a date-time")
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def epoch(value: datetime | str | None) -> float | None:
    """A datetime from raw SQL as epoch seconds (`aware`'s conversion); None stays None."""
    moment = aware(value)
    return None if moment is None else moment.timestamp()


def placeholders(n: int) -> str:
    """`%s, %s, …` for a VALUES list (or, on SQLite, an IN list) of n values."""
    return ", ".join(["%s"] * n)


def postgresql() -> bool:
    return connection.vendor == "postgresql"


STATE_NAME = re.compile(r"[a-z_]+")


def state_literal(state: str) -> str:
    """A state machine's state (an enum's value, never user input) written into the SQL
    text as a literal, where a parameter would be the one selective condition of the
    statement. A statement run a fifth time on a PostgreSQL connection is prepared
    (settings: prepare_threshold), and the server may then plan it once for any value:
    for `state = $1 LIMIT 1` that generic plan is a table scan, cheap on average over
    the states, and for a state no row is in it reads the whole table. The ledger's
    look for pending rows, twenty times a second per worker, took 45-80 ms three minutes
    into a run (log_min_duration_statement), growing with the ledger. With the value in
    the text the plan is the state's own: an index probe. It is also how a query reaches
    a partial index (`WHERE state = 'open'`): its own WHERE must say the same words."""
    if not STATE_NAME.fullmatch(state):
        raise ValueError(f"not a state name: {state!r}")
    return f"'{state}'"


# How often a `rare` condition holds, as SQLite's planner is told: an open state among
# the millions of finished rows a year leaves.
RARE = 0.001


def rare(condition_sql: str) -> str:
    """A condition true of few rows (a row in an open state), so said to SQLite's planner:
    `likelihood(condition, 0.001)`; on PostgreSQL the condition as it is (its statistics
    keep the most common values, so it knows). SQLite's own statistics, if anyone runs
    ANALYZE (or `PRAGMA optimize`) on the file, say only how many rows a value matches on
    average: with 599,500 buffers all flushed, `state = 'open'` reads as 599,500 rows,
    and the planner walked the whole table in id order instead of the state index
    (the typing look: 50 ms against 0.2; the ledger's sweeps 340-420 ms against 2-4, on
    tests.bench.grown's file). Without statistics its guesses were right: the hint makes
    the plan the same either way."""
    return f"likelihood({condition_sql}, {RARE})" if connection.vendor == "sqlite" else condition_sql


class Rare(Expression):
    """`rare` for the ORM: `queryset.filter(Rare(Q(state__in=OPEN)))`, the Q's own SQL,
    on SQLite inside likelihood()."""

    conditional = True
    output_field = BooleanField()

    def __init__(self, condition: Any) -> None:  # a Q, or any boolean expression
        super().__init__()
        self.condition = condition

    def get_source_expressions(self) -> list[Any]:
        return [self.condition]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.condition,) = exprs

    def resolve_expression(self, query: Any = None, allow_joins: bool = True, reuse: Any = None,
                           summarize: bool = False, for_save: bool = False) -> Rare:
        resolved = self.copy()
        resolved.condition = self.condition.resolve_expression(query, allow_joins, reuse, summarize, for_save)
        return resolved

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        sql, params = compiler.compile(self.condition)
        return sql, params

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        sql, params = compiler.compile(self.condition)
        return f"likelihood({sql}, {RARE})", params


def in_sql(column_sql: str, n: int, cast: str | None = "bigint") -> str:
    """`column IN (%s, …)` for n values, with its parameters from `in_params`. On
    PostgreSQL one array parameter, `column = ANY(%s::bigint[])`: the statement reads
    the same for any number of values. psycopg caches its parse of a statement only up
    to 4 KB of text, and 500 placeholders are more than that: a batch's claim or
    delivered mark was split by regular expression on every call, a third of the
    worker's database thread in the recovery benchmark. The server, too, parses one
    array faster than 500 literals. `cast`: the column's type (None for text, whose
    untyped literal takes the column's)."""
    if postgresql():
        return f"{column_sql} = ANY(%s{'::' + cast + '[]' if cast else ''})"
    return f"{column_sql} IN ({placeholders(n)})"


def in_params(values: Iterable[Any]) -> list[Any]:
    """The parameters of an `in_sql` of these values."""
    values = list(values)
    if not postgresql():
        return values
    return [int_array(values) if all(isinstance(value, int) for value in values) else values]


def int_array(values: Iterable[int]) -> str:
    """Integers as PostgreSQL's array literal, `{1,2,3}`: one text parameter, which
    psycopg quotes in C. Given a list, psycopg dumps and quotes each element in Python,
    which for a batch of 500 ids cost more than the statement (py-spy, the worker's
    database thread)."""
    return "{" + ",".join(str(int(value)) for value in values) + "}"


class ArrayIn(_In):
    """`__in` with a list of values on an integer column, on PostgreSQL: one array
    parameter (see in_sql), so a claim of 500 ids (Model.transition, ledger.claim_many)
    is not a statement too long for psycopg's cache. Anything else (a subquery, another
    database, an empty list) compiles as Django's own `In`."""

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> _AsSqlType:
        if not self.rhs_is_direct_value() or not isinstance(self.rhs, (list, tuple, set, frozenset)):
            return super().as_sql(compiler, connection)
        values = [value for value in self.rhs if value is not None]  # NULL equals nothing, as in In
        if not values or not all(isinstance(value, int) for value in values):
            return super().as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::{self.lhs.output_field.cast_db_type(connection)}[])", (*lhs_params, int_array(values))


def register_lookups() -> None:
    """Once, at start-up (CoreConfig.ready): every integer column's `__in`."""
    IntegerField.register_lookup(ArrayIn)


def recordset(alias: str, columns: Iterable[tuple[str, str | None]]) -> str:
    """A batch's rows as one JSON parameter (with `records`), a row source named `alias`
    with `columns`, (name, type) pairs, in a statement that reads the same for any
    number of rows (see in_sql for why that matters). PostgreSQL:
    `json_to_recordset(%s::json) AS alias(name type, …)` (psycopg quotes an array
    parameter element by element in Python, which made up a fifth of the web process's
    admissions, py-spy; json.dumps is one call in C). SQLite: a subquery over
    `json_each(%s)`, each column extracted from its object (types left to the columns
    the values meet: SQLite's affinity)."""
    columns = list(columns)
    if not postgresql():
        extracted = ", ".join(f"json_extract(value, '$.{name.strip(chr(34))}') AS {name}" for name, _ in columns)
        return f"(SELECT {extracted} FROM json_each(%s)) AS {alias}"
    return f"json_to_recordset(%s::json) AS {alias}({', '.join(f'{name} {kind}' for name, kind in columns)})"


def records(names: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """The JSON parameter of a `recordset` with these column names, from rows of values
    in that order; a datetime travels as ISO 8601 text, with its offset."""
    return json.dumps([{name: _json_value(value) for name, value in zip(names, row)} for row in rows])


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if type(value).__name__ in ("Jsonb", "Json"):  # a JSONField's value, wrapped for psycopg with its encoder
        return json.loads(value.dumps(value.obj)) if value.dumps else value.obj
    return value


@functools.lru_cache(maxsize=32)  # one entry per (model, conflict, returning, form) the code inserts
def _insert_sql(model: type[Model], conflict: tuple[str, ...], returning: tuple[str, ...],
                many: bool) -> tuple[str, list[Field[Any, Any]]]:
    """INSERT of every concrete column but the key, `VALUES (%s, …)` for one row or, with
    `many`, `SELECT … FROM json_to_recordset(%s)` for a batch (PostgreSQL), [ON CONFLICT
    (conflict) DO NOTHING] RETURNING `returning`."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    names = ", ".join(quote(_db_column(f)) for f in fields)
    if many:
        rows = f"SELECT {names} FROM {recordset('r', [(quote(_db_column(f)), f.db_type(connection)) for f in fields])}"
        if conflict and not postgresql():
            rows += " WHERE true"  # SQLite: an upsert after a SELECT needs a WHERE, or ON reads as a join's
    else:
        rows = f"VALUES ({placeholders(len(fields))})"
    on_conflict = f" ON CONFLICT ({', '.join(quote(c) for c in conflict)}) DO NOTHING" if conflict else ""
    sql = (f"INSERT INTO {table(model)} ({names}) {rows}"
           f"{on_conflict} RETURNING {', '.join(quote(c) for c in returning)}")
    return sql, fields


def insert(instance: Model, conflict: Iterable[str] = ()) -> bool:
    """INSERT [… ON CONFLICT (conflict) DO NOTHING] RETURNING id (SQLite ≥ 3.35 and
    PostgreSQL): one statement, no savepoint, and no exception to unwind for a
    duplicate; False when the row already existed. Plain SQL: on the hot path (an
    inbound message's admission) the ORM's save() cost more than the statement."""
    sql, fields = _insert_sql(type(instance), tuple(conflict), ("id",), False)
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    instance.pk = row[0]
    instance._state.adding, instance._state.db = False, connection.alias
    return True


def update_in_state(model: type[Model], pk: int, fields: dict[str, Any], state: str) -> bool:
    """UPDATE … SET fields WHERE id = %s AND state = %s: a compare-and-swap on one row's
    state, True if it held. Plain SQL: on the hot path (a buffer re-armed by each
    message) the ORM's compile of this one statement cost as much as running the whole
    transaction."""
    sql, columns = _update_in_state_sql(model, tuple(fields))
    params = [f.get_db_prep_save(value, connection) for f, value in zip(columns, fields.values())]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, pk, state])
        held: bool = cursor.rowcount == 1
        return held


@functools.lru_cache(maxsize=8)  # one entry per (model, set of fields) the code updates
def _update_in_state_sql(model: type[Model], names: tuple[str, ...]) -> tuple[str, list[Any]]:
    quote = connection.ops.quote_name
    columns = [model._meta.get_field(name) for name in names]
    sql = (f"UPDATE {table(model)} SET "
           + ", ".join(f"{quote(_db_column(f))} = %s" for f in columns)
           + f" WHERE {quote('id')} = %s AND {quote('state')} = %s")
    return sql, columns


def insert_many(model: type[Model], instances: Iterable[Model], conflict: Iterable[str] = (),
                returning: Iterable[str] = ("id",)) -> list[tuple[Any, ...]]:
    """The instances' rows in one statement (`INSERT … SELECT … FROM` their `recordset`
    `[ON CONFLICT (conflict) DO NOTHING] RETURNING …`). Returns the `returning` columns
    of the rows inserted; a conflicting row returns nothing, so with `conflict` callers
    match the rows to their instances by a key they returned. Without, on PostgreSQL
    the rows come back in the instances' order, which Django's bulk_create relies on
    too (its INSERT … SELECT * FROM UNNEST form); SQLite documents RETURNING's order as
    arbitrary (create_many matches its rows by their rowids' order)."""
    sql, params = insert_statement(model, instances, conflict, returning)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        inserted: list[tuple[Any, ...]] = cursor.fetchall()
        return inserted


def insert_statement(model: type[Model], instances: Iterable[Model], conflict: Iterable[str] = (),
                     returning: Iterable[str] = ("id",)) -> tuple[str, list[str]]:
    """`insert_many`'s statement and its one parameter, made without the database: its
    values can be prepared before the transaction that runs it (flushing._prepare)."""
    sql, fields = _insert_sql(model, tuple(conflict), tuple(returning), True)
    preparers = _preparers(tuple(fields))
    values = [[prepare(instance) for prepare in preparers] for instance in instances]
    return sql, [records([_db_column(f) for f in fields], values)]


# Field classes whose value, when of one of these exact types, goes to the database as
# it is: Django's get_db_prep_save gives it back unchanged (to_python of a str is the
# str, int() of an int the int…). Exact classes, not subclasses, which may convert.
_PASSED_AS_THEY_ARE: dict[type[Field[Any, Any]], tuple[type, ...]] = {
    **dict.fromkeys((CharField, TextField, SlugField), (str, type(None))),
    **dict.fromkeys((IntegerField, BigIntegerField, SmallIntegerField, PositiveIntegerField,
                     PositiveSmallIntegerField, PositiveBigIntegerField, AutoField, BigAutoField),
                    (int, type(None))),
    BooleanField: (bool, type(None)),
    FloatField: (float, type(None)),
}


@functools.lru_cache(maxsize=32)  # one entry per field list _insert_sql makes
def _preparers(fields: tuple[Field[Any, Any], ...]) -> list[Callable[[Model], Any]]:
    """For each field, the value of an instance as the database takes it: Django's
    `get_db_prep_save(pre_save(instance))`, skipped where it would change nothing — the
    field's plain attribute, of a type its class passes as it is (a key of a row the
    target's integer; an aware datetime, `_datetime_preparer`). Django's chain cost 0.6 ms
    per 16 turns and 1 ms per 16 ledger rows, inside the transaction that holds SQLite's
    one write lock; these 0.13 and 0.38 ms (tests.bench.batch_values)."""
    return [_preparer(field) for field in fields]


def _preparer(field: Field[Any, Any]) -> Callable[[Model], Any]:
    def full(instance: Model) -> Any:
        return field.get_db_prep_save(field.pre_save(instance, True), connection)

    if type(field) is DateTimeField and not (field.auto_now or field.auto_now_add):  # (those set it in pre_save)
        return _datetime_preparer(field, full)
    kind = type(field.target_field) if isinstance(field, ForeignKey) else type(field)
    plain = _PASSED_AS_THEY_ARE.get(kind)
    if plain is None or type(field).pre_save is not Field.pre_save or type(field) not in (
            *_PASSED_AS_THEY_ARE, ForeignKey, OneToOneField):
        return full
    attname = field.attname

    def fast(instance: Model) -> Any:
        value = getattr(instance, attname)
        return value if type(value) in plain else full(instance)

    return fast


def _datetime_preparer(field: Field[Any, Any], full: Callable[[Model], Any]) -> Callable[[Model], Any]:
    """A DateTimeField's value: None as it is, an aware datetime straight to the backend's
    adapter (what Django's get_prep_value leaves of it: its to_python gives a datetime
    back, and only a naive one is changed, with a warning); anything else Django's way."""
    attname = field.attname

    def fast(instance: Model) -> Any:
        value = getattr(instance, attname)
        if value is None:
            return None
        if type(value) is datetime and value.tzinfo is not None:
            return connection.ops.adapt_datetimefield_value(value)
        return full(instance)

    return fast


def create_many(model: type[M], instances: Iterable[M], statement: tuple[str, list[str]] | None = None) -> list[M]:
    """`bulk_create` (the instances, saved, with their ids), as one JSON parameter
    (insert_many) rather than Django's array per column (PostgreSQL) or its VALUES row
    per instance (SQLite, whose compile and binding were a quarter of the flusher's hold
    on the write lock, py-spy). On SQLite the ids are matched to the instances by their
    order: the statement holds the database's one write lock and inserts the rows in
    the JSON array's order, each taking the next rowid, while RETURNING's own order is
    documented as arbitrary. `statement`: the instances' `insert_statement`, made
    before (the values as they are now)."""
    instances = list(instances)
    if not instances:
        return instances
    if statement is None:
        inserted = insert_many(model, instances)
    else:
        with connection.cursor() as cursor:
            cursor.execute(*statement)
            inserted = cursor.fetchall()
    ids = inserted if postgresql() else sorted(inserted)
    for instance, (pk,) in zip(instances, ids, strict=True):
        instance.pk = pk
        instance._state.adding, instance._state.db = False, connection.alias
    return instances
