"""Model instances from hand-written SQL, for the few statements on the timed path (the
flusher's claim, the ready-turn query, a turn's history): the ORM compiles a query anew
on every call, which there cost more than the database did. The columns are listed from the model once; each value goes
through the same converters the ORM applies (SQLite's naive datetimes made aware, JSON
text decoded), so an instance built here is the one a queryset would have given.
"""

import functools

from django.db import connection


class Columns:
    """The concrete columns of `model` (or just `only`, the rest left deferred) under
    `alias`: `.sql` for a SELECT list, `.build(values)` for an instance."""

    def __init__(self, model, alias, only=None):
        fields = [f for f in model._meta.concrete_fields if only is None or f.attname in only]
        self.model, self.names = model, [f.attname for f in fields]
        quote = connection.ops.quote_name
        self.sql = ", ".join(f"{alias}.{quote(f.column)}" for f in fields)
        self.width = len(fields)
        self.converters = []
        for index, field in enumerate(fields):
            col = field.get_col(alias)
            chain = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if chain:
                self.converters.append((index, col, chain))

    def build(self, values):
        values = list(values)
        for index, col, chain in self.converters:
            for convert in chain:
                values[index] = convert(values[index], col, connection)
        return self.model.from_db(connection.alias, self.names, values)


@functools.lru_cache(maxsize=64)  # a handful of call sites, each with fixed arguments
def columns(model, alias, only=None):
    """`Columns` for (model, alias, only), made once per process. `only`: a frozenset of
    attnames, or None for all."""
    return Columns(model, alias, only)


def table(model):
    return connection.ops.quote_name(model._meta.db_table)


def column(model, name):
    return connection.ops.quote_name(model._meta.get_field(name).column)


def placeholders(n) -> str:
    """`%s, %s, …` for an IN list of n values."""
    return ", ".join(["%s"] * n)
