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
- never counts facets (`?_facets=1` would count every filter value over the table);
- searches text (`search_fields`, Django's `icontains`: no index can help) in the newest
  SEARCH_WINDOW rows of the current list, along the date drill-down's index, and
  identifiers (`exact_matches`: a message's platform id, a row's id, a claim's scope) in
  every row through an index; the page says so. A rare term's search read the whole
  table: 0.5-2.8 s on a week of traffic. The first page of a common term's matches is
  the same either way (the list is newest first); an older one is a date away.

The page itself is a LIMIT/OFFSET over the sorted rows: the columns a changelist sorts
and filters by need an index (each model's Meta says which ones are there for its admin).
"""

import functools
import json
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.contrib import messages
from django.contrib.admin import AllValuesFieldListFilter, ShowFacets
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import F, Max, Min, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext

COUNT_CAP = 10_000
FILTER_SAMPLE = 10_000
# Text is searched in this many of the list's newest rows: about 100 ms of LIKE on either
# database at the grown benchmark's row sizes (tests.bench grown), a day or two of a busy
# bot's traffic.
SEARCH_WINDOW = 100_000
# Rows an identifier search adds at most (an identifier names one row, or a handful).
EXACT_CAP = 100
# A search's matches up to this many are read once as ids (see get_search_results).
MATCHES_READ = 1_000
# The table's newest (or oldest) rows a list's last (or first) date is looked for among
# first (`_bound`).
BOUND_SAMPLE = 1_000
# A list's page is looked for among the table's first PAGE_EDGE rows in its order first
# (EstimatedCountPaginator._ids_near_the_edge).
PAGE_EDGE = 1_000
# Either sample, not holding what is looked for, is tried once more this many times
# bigger before the list is read whole: a quiet channel's turns behind a busy one's
# 3,000 newest (tests.bench.grown, its flush runs) were not among the table's newest
# 1,000, and the page read all 199,000 of the channel's and sorted them (124 ms, and
# 105 ms for its last date); among the newest 10,000 they were (7.5 ms).
EDGE_GROWTH = 10


def edge_sizes(first: int) -> tuple[int, int]:
    """The table's edge samples tried in turn: `first` rows, then EDGE_GROWTH times more."""
    return first, first * EDGE_GROWTH


def count_up_to(rows: QuerySet[Any], cap: int = COUNT_CAP) -> int:
    """The rows counted, stopping at cap + 1 (more than `cap`): a count that reads as many
    index entries as it needs, never a whole big table's."""
    return rows.order_by()[: cap + 1].count()


def window_of_latest(rows: QuerySet[Any], field: str, since: Any, latest: int) -> Any:
    """When the window holding at most the `latest` newest of `rows` since `since` starts:
    `since` itself when fewer are that recent, else the `field` of the oldest of those
    (one walk of `latest` entries of the field's index). A chart or a rate over the window
    then reads a bounded number of rows however busy the day was."""
    oldest = (rows.filter(**{f"{field}__gte": since}).order_by(f"-{field}")
              .values_list(field, flat=True)[latest - 1:latest].first())
    return max(since, oldest) if oldest else since


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]  # rows of any model
    """Exact up to COUNT_CAP rows; past it, the planner's estimate (PostgreSQL) or the cap."""

    capped = False  # more rows than COUNT_CAP: `count` is an estimate or the cap itself
    edge_field = ""  # the list's date (its admin's date_hierarchy), walked by `_ids_near_the_edge`
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
        ids = self._ids_near_the_edge(rows, bottom, bottom + self.per_page)
        if ids is None:
            ids = list(rows.values_list("pk", flat=True)[bottom:bottom + self.per_page])
        found = {row.pk: row for row in rows.order_by().filter(pk__in=ids)}
        page = [found[pk] for pk in ids if pk in found]
        return self._get_page(page, number, self)  # type: ignore[attr-defined]  # Django's own hook, not in the stubs

    def _ids_near_the_edge(self, rows: QuerySet[Any], bottom: int, top: int) -> list[Any] | None:
        """A page of a list sorted by its date, looked for among the table's first
        PAGE_EDGE rows in the same order; None when they do not hold it. A filter with an
        index of its own (the turns of a channel, through their conversations) made
        SQLite read every row it matched and sort them (130-160 ms on 600,000 turns),
        where the date's index stops after a page. The order is total (Django's
        changelist ends it with the primary key), so if PAGE_EDGE rows in that order hold
        `top` of the list's, they are its first `top`. SQLite only; the edge grows once
        (edge_sizes) before the list is read whole."""
        order = list(rows.query.order_by)
        leading = order[0] if order and isinstance(order[0], str) else ""
        if (not self.edge_field or leading.lstrip("-") != self.edge_field
                or connections[rows.db].vendor != "sqlite"):  # PostgreSQL's planner needs no help here (see _bound)
            return None
        for size in edge_sizes(PAGE_EDGE):
            if top <= size:
                near = list(rows.filter(pk__in=table_edge(rows, order, size)).values_list("pk", flat=True)[:top])
                if len(near) == top:
                    return near[bottom:]
        return None


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
            found[name] = _bound(rows, column, "" if isinstance(aggregate, Min) else "-")
        cache[key] = found
        return dict(found)

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None) -> list[datetime]:
        rows: QuerySet[Any] = self  # type: ignore[assignment]
        bounds = self.aggregate(first=Min(field_name), last=Max(field_name))
        if bounds["first"] is None:
            return []
        found = [start for start, end in periods(timezone.localtime(bounds["first"]),
                                                 timezone.localtime(bounds["last"]), kind)
                 if _holds_any(rows.filter(**{f"{field_name}__gte": start, f"{field_name}__lt": end}), field_name)]
        return found if order == "ASC" else found[::-1]


def table_edge(rows: QuerySet[Any], order: list[Any], size: int) -> QuerySet[Any]:
    """The ids of the first `size` rows of the whole table (no filter) in `order`, as a
    subquery: where a list's first rows are looked for on SQLite (`_bound`, the page)."""
    edge: QuerySet[Any] = rows.model._default_manager.order_by(*order).values("pk")[:size]
    return edge


def _holds_any(rows: QuerySet[Any], field_name: str) -> bool:
    """Whether a period of the list holds a row. On PostgreSQL asked along the date's
    order: a bare EXISTS of a day at the end of a table written in time order was a
    sequential scan from its start (the planner counts on rows spread evenly: 80 ms on
    2 million audit events, twice per page), where the date's index finds it at once."""
    if connections[rows.db].vendor != "postgresql":
        return rows.exists()
    return rows.order_by(field_name).values_list(field_name, flat=True).first() is not None


def _bound(rows: QuerySet[Any], column: str, direction: str) -> Any:
    """The list's first (direction "") or last ("-") value of a date column, its index
    walked: looked for among the table's BOUND_SAMPLE oldest or newest rows first. A
    filter with an index of its own (a channel's: a third of the table) made SQLite's
    planner read every row it matched and sort them for one (110-150 ms on a million
    ledger rows), where the date's index stops at the first match. Any match among those
    rows is the bound: every row of the list beyond them is older (or newer). SQLite only;
    the sample grows once (edge_sizes) before the list is read whole."""
    ordered = rows.filter(**{f"{column}__isnull": False}).order_by(f"{direction}{column}")
    if connections[rows.db].vendor != "sqlite":  # PostgreSQL's planner walks the date's index itself (1 ms),
        return ordered.values_list(column, flat=True).first()  # and hashed the whole list against the sample (70 ms)
    for size in edge_sizes(BOUND_SAMPLE):
        edge = table_edge(rows, [f"{direction}{column}"], size)
        value = ordered.filter(pk__in=edge).values_list(column, flat=True).first()
        if value is not None:
            return value
    return ordered.values_list(column, flat=True).first()


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

    paginator: ClassVar[type] = EstimatedCountPaginator  # as ModelAdmin declares it
    show_full_result_count = False
    show_facets = ShowFacets.NEVER

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _BigChangeList

    def get_paginator(self, request: HttpRequest, queryset: QuerySet[Any], per_page: int, orphans: int = 0,
                      allow_empty_first_page: bool = True) -> Paginator:  # type: ignore[type-arg]
        paginator = super().get_paginator(request, queryset, per_page, orphans,  # type: ignore[misc]
                                          allow_empty_first_page)
        paginator.edge_field = self.date_hierarchy or ""  # type: ignore[attr-defined]
        return paginator  # type: ignore[no-any-return]

    def exact_matches(self, term: str) -> Q | None:
        """The rows a search term names whole (an identifier), as a condition an index
        answers over the whole table; None when it names none. Each admin says which of
        its columns are identifiers (and indexed)."""
        return None

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        search_term = search_term.strip()
        if not search_term:
            found: tuple[QuerySet[Any], bool] = super().get_search_results(  # type: ignore[misc]
                request, queryset, search_term)
            return found
        # None: no date index to walk, or a list that is all recent.
        floor = search_window_floor(queryset, self.date_hierarchy)  # type: ignore[attr-defined]
        searched = queryset if floor is None else queryset.filter(**{f"{self.date_hierarchy}__gte": floor})  # type: ignore[attr-defined]
        rows, may_have_duplicates = super().get_search_results(request, searched, search_term)  # type: ignore[misc]
        named = self._named_rows(queryset, search_term) if floor is not None else []
        # A page reads its search several times (the count, the date drill-down's first
        # and last dates and its periods, the page): a rare term's few matches are read
        # once, as ids, instead of scanning for them each time (six scans of 30-45 ms
        # over a million claims' window; two of 130-170 ms over 200,000 conversations
        # and their contacts). A common term's scans stop early; it keeps its condition.
        matched = list(rows.order_by().values_list("pk", flat=True)[:MATCHES_READ + 1])
        if len(matched) <= MATCHES_READ:
            rows, may_have_duplicates = queryset.filter(pk__in={*matched, *named}), False
        elif named:
            # One list of ids, not an OR of the two conditions: ORed, SQLite walked the
            # whole date index for the page's order (200 ms on a million ledger rows).
            also = self.model._default_manager.filter(pk__in=named).order_by().values("pk")  # type: ignore[attr-defined]
            rows = queryset.filter(pk__in=rows.order_by().values("pk").union(also, all=True))
        if floor is not None:
            messages.info(request, gettext(
                "Text was searched in the newest %(rows)s rows of this list (since %(since)s), identifiers in all of "
                "them. Pick a date above to search text further back.") % {
                    "rows": f"{SEARCH_WINDOW:,}", "since": f"{timezone.localtime(floor):%Y-%m-%d %H:%M}"})
        return rows, may_have_duplicates

    def _named_rows(self, queryset: QuerySet[Any], search_term: str) -> list[Any]:
        """Ids of the rows the whole term, or one of its words, names (`exact_matches`)."""
        terms = {search_term}
        for word in smart_split(search_term):
            if word[:1] in ('"', "'") and word[-1:] == word[:1]:
                word = unescape_string_literal(word)
            terms.add(word)
        conditions = [condition for condition in map(self.exact_matches, sorted(terms)[:10]) if condition is not None]
        if not conditions:
            return []
        return list(queryset.filter(functools.reduce(lambda a, b: a | b, conditions)).order_by()
                    .values_list("pk", flat=True)[:EXACT_CAP])


def search_window_floor(rows: QuerySet[Any], field: str | None) -> Any:
    """The date from which the list's newest SEARCH_WINDOW rows run (one walk along the
    date's index), or None when the list has fewer rows or no date index to walk."""
    if not field:
        return None
    newest = rows.order_by(f"-{field}").values_list(field, flat=True)
    return next(iter(newest[SEARCH_WINDOW - 1:SEARCH_WINDOW]), None)


def per_channel(model: Any, **identifier: str) -> Q:
    """An identifier unique within a channel, as the (channel, identifier) index answers
    it: one seek per channel (a handful), where the identifier alone reads the table."""
    channels = model._meta.get_field("channel").related_model
    return Q(channel__in=list(channels.objects.values_list("pk", flat=True)), **identifier)


def numeric_id(term: str) -> Q | None:
    """A row's own id, when the term is one."""
    return Q(pk=int(term)) if term.isdigit() and len(term) < 19 else None
