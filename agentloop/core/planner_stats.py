"""The planner's row counts kept up with tables that grow fast (PostgreSQL).

A statement run a fifth time on a connection is prepared there (settings:
prepare_threshold), and PostgreSQL may keep one generic plan for it until the table's
statistics change. A plan made while a table was small reads it whole: the flusher's
`buffer_id = ANY($1)` and the turns' `id = ANY($1)` stayed sequential scans while their
tables grew from a few hundred rows to tens of thousands. Autovacuum analyzes a table
once a tenth of it changed, but looks only every `autovacuum_naptime` (a minute by
default), and a new deployment's tables can grow a hundredfold in that minute: on a fresh
database paced at 293 messages/s, the flusher's read of a batch's messages took 0.73 ms
and then 2.8 ms a statement (pg_stat_statements), the turns' 0.66 and then 2.3 ms, 2,303
and 1,450 sequential scans over 12 and 7 million rows, until autovacuum's analysis 90 s
in (after it, neither was among the eight costliest statements).

So a worker's housekeeping analyzes each of its hot tables that holds more than twice
the rows the planner last counted (and at least MIN_ROWS more): a handful of times while
a table is young, then hardly ever (autovacuum's tenth comes first). An analysis makes
PostgreSQL plan the statements on that table again, for its size now.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection

GROWTH = 2.0  # live rows over the planner's count
MIN_ROWS = 1000  # fewer rows than this more, and any plan reads them quickly


def grown(tables: Sequence[str]) -> list[str]:
    """Those of `tables` (names) holding more than GROWTH times the rows their statistics
    counted, and MIN_ROWS more; never analyzed counts as none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.relname = ANY(%s) AND s.n_live_tup > %s * GREATEST(c.reltuples, 0) "
            "AND s.n_live_tup - GREATEST(c.reltuples, 0) >= %s ORDER BY s.relname",
            [list(tables), GROWTH, MIN_ROWS])
        return [name for (name,) in cursor.fetchall()]


def refresh(tables: Sequence[str]) -> list[str]:
    """Analyze those of `tables` that `grown` names (PostgreSQL; nothing elsewhere): the
    names analyzed. SKIP_LOCKED: one another worker is analyzing is left to it. A table
    this role does not own is skipped by PostgreSQL with a warning, not an error."""
    if connection.vendor != "postgresql":
        return []
    names = grown(tables)
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"ANALYZE (SKIP_LOCKED) {connection.ops.quote_name(name)}")
    return names
