"""The admin on tables that grow by the million (issue 30: every changelist answers in
300 ms on a week of traffic).

Django's admin counts a changelist twice (the filtered rows and, beside them, the whole
table) and builds its date drill-down from `SELECT DISTINCT` of the truncated date of
every row: on 1 million messages that was 3-20 s per page. `BigTableAdmin`:

- counts at most COUNT_CAP + 1 rows (`SELECT COUNT(*) FROM (… LIMIT 10001)`); past the
  cap the page says "more than 10,000" on SQLite and shows PostgreSQL's own estimate of
  the filtered query (its planner's row count, from `pg_class.reltuples` and the
  statistics) marked "about": either is cheap whatever the table's size;
- never counts the whole table (`show_full_result_count = False`);
- builds the date drill-down from the first and last dates (one index seek each: SQLite
  reads the whole table for a MIN and a MAX asked in one SELECT) and one `EXISTS` per
  year, month or day between them, instead of reading every row;
- offers a text column's values in its filter from the latest FILTER_SAMPLE rows
  (`RecentValuesFilter`), not from a `SELECT DISTINCT` over the table;
- never counts facets (`?_facets=1` would count every filter value over the table).

The page itself is a LIMIT/OFFSET over the sorted rows: the columns a changelist sorts
and filters by need an index (each model's Meta says which ones are there for its admin).
"""

import functools
import json
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin import AllValuesFieldListFilter, ShowFacets
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import F, Max, Min, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property

COUNT_CAP = 10_000
FILTER_SAMPLE = 10_000


def count_up_to(rows: QuerySet[Any], cap: int = COUNT_CAP) -> int:
    """The rows counted, stopping at cap + 1 (more than `cap`): a count that reads as many
    index entries as it needs, never a whole big table's."""
    return rows.order_by()[: cap + 1].count()


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]  # rows of any model
    """Exact up to COUNT_CAP rows; past it, the planner's estimate (PostgreSQL) or the cap."""

    capped = False  # more rows than COUNT_CAP: `count` is an estimate or the cap itself
    estimated = False  # `count` is PostgreSQL's estimate

    @cached_property
    def count(self) -> int:
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        exact = count_up_to(rows)
        if exact <= COUNT_CAP:
            return exact
        self.capped = True
        estimate = planner_estimate(rows)
        self.estimated = estimate is not None and estimate > COUNT_CAP
        return estimate if estimate is not None and estimate > COUNT_CAP else COUNT_CAP

    def page(self, number: Any) -> Any:
        """The page's ids first, sorted and sliced as narrow rows, then their rows: a
        filter that leaves 200,000 rows to sort no longer sorts them whole (the turns of a
        channel on SQLite: 0.84 s sorting whole rows, 0.11 s sorting their ids)."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        ids = list(rows.values_list("pk", flat=True)[bottom:bottom + self.per_page])
        found = {row.pk: row for row in rows.order_by().filter(pk__in=ids)}
        page = [found[pk] for pk in ids if pk in found]
        return self._get_page(page, number, self)  # type: ignore[attr-defined]  # Django's own hook, not in the stubs


def planner_estimate(rows: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of the rows a query returns (EXPLAIN: no row is read), or None."""
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = rows.order_by().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


class ProbedDates:
    """A queryset's `datetimes()` as the admin's date drill-down asks for it, answered
    with MIN/MAX and one EXISTS per candidate period (at most a few years, 12 months or
    31 days) instead of a DISTINCT over every row."""

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """MIN and MAX of plain columns as one ordered LIMIT 1 each (an index seek); anything else as Django does."""
        rows: QuerySet[Any] = self  # type: ignore[assignment]
        simple = not args and all(type(a) in (Min, Max) and len(a.source_expressions) == 1
                                  and isinstance(a.source_expressions[0], F) and a.filter is None
                                  for a in kwargs.values())
        if not simple or not kwargs:
            found_by_django: dict[str, Any] = super().aggregate(*args, **kwargs)  # type: ignore[misc]
            return found_by_django
        # Asked twice per page (Django's drill-down, then datetimes() below): read once.
        key = tuple(sorted((name, repr(a)) for name, a in kwargs.items()))
        cache = self.__dict__.setdefault("_bounds", {})
        if key in cache:
            return dict(cache[key])
        found = {}
        for name, aggregate in kwargs.items():
            column = aggregate.source_expressions[0].name
            ordered = rows.filter(**{f"{column}__isnull": False}).order_by(
                column if isinstance(aggregate, Min) else f"-{column}")
            found[name] = ordered.values_list(column, flat=True).first()
        cache[key] = found
        return dict(found)

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None) -> list[datetime]:
        rows: QuerySet[Any] = self  # type: ignore[assignment]
        bounds = self.aggregate(first=Min(field_name), last=Max(field_name))
        if bounds["first"] is None:
            return []
        found = [start for start, end in periods(timezone.localtime(bounds["first"]),
                                                 timezone.localtime(bounds["last"]), kind)
                 if rows.filter(**{f"{field_name}__gte": start, f"{field_name}__lt": end}).exists()]
        return found if order == "ASC" else found[::-1]


def periods(first: datetime, last: datetime, kind: str) -> list[tuple[datetime, datetime]]:
    """The years, months or days (local time, aware) from the one holding `first` to the one holding `last`."""
    if kind not in ("year", "month", "day"):
        raise ValueError(f"no drill-down by {kind!r}")
    start = first.replace(month=1 if kind == "year" else first.month, day=1 if kind != "day" else first.day,
                          hour=0, minute=0, second=0, microsecond=0)
    found = []
    while start <= last:
        end = _next(start, kind)
        found.append((start, end))
        start = end
    return found


def _next(start: datetime, kind: str) -> datetime:
    if kind == "year":
        naive = start.replace(tzinfo=None, year=start.year + 1)
    elif kind == "month":
        naive = start.replace(tzinfo=None, year=start.year + start.month // 12, month=start.month % 12 + 1)
    else:
        naive = start.replace(tzinfo=None) + timedelta(days=1)
    return timezone.make_aware(naive, start.tzinfo)


@functools.cache  # one class per queryset class (a handful)
def _probed(cls: type) -> type:
    return type(f"Probed{cls.__name__}", (ProbedDates, cls), {})


class _BigChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        rows = super().get_queryset(request, exclude_parameters)
        rows.__class__ = _probed(type(rows))
        return rows


class RecentValuesFilter(AllValuesFieldListFilter):
    """A text column's filter whose choices are the values of the latest FILTER_SAMPLE
    rows: an older value is still filtered by its URL, only not offered."""

    def __init__(self, field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any,
                 field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        latest = model._default_manager.order_by("-pk").values_list(field_path, flat=True)[:FILTER_SAMPLE]
        self.lookup_choices = sorted({value for value in latest if value is not None})  # type: ignore[assignment]


class BigTableAdmin:
    """A ModelAdmin mixin for the tables that grow with the traffic."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = ShowFacets.NEVER

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _BigChangeList
