"""The CalDAV calendar backend (Nextcloud, Fastmail, iCloud, Radicale…).

Design:

* One calendar for the whole deployment, the one named AGENTLOOP_CALDAV_CALENDAR under
  the account's principal (created on first use). Its events belong to many contacts, so
  each event carries whose it is in an ``X-AGENTLOOP-SCOPE`` property (the scope key,
  e.g. ``contact:12``) and ``find``/``list``/``delete`` only ever see the events of the
  scope they are given. Any CalDAV server stores unknown ``X-`` properties verbatim;
  the filtering is done here (exact match), not by the server, because servers differ in
  how (and whether) they filter on ``X-`` properties and a text-match is a substring
  match (``contact:1`` would match ``contact:12``).
* The event's UID is the one the tool derives from the guard's claim, not a fresh one. A
  create whose outcome is unknown (the connection dropped while the PUT was in flight)
  can then be reconciled by looking that UID up: found means it happened, not found
  means it did not. The PUT is sent with ``If-None-Match: *`` so it never overwrites an
  existing event; if the UID is already there *in this scope*, that is this very create
  having happened before, and its event is returned.
* Errors are told apart by whether the server can have changed anything: a failure to
  connect, any failed read and any HTTP refusal (4xx/5xx) raise ``ToolError`` (it did
  not happen, a retry may run); a timeout or a dropped connection while a PUT or DELETE
  was on the wire raises ``OutcomeUnknown`` (it may have happened), and the guard then
  reconciles through ``find``.
* The client and calendar are cached per thread (worker threads each get their own
  HTTP session) and per configuration; a failed request drops the cache so the next
  call connects and looks the calendar up afresh.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, date, datetime, time
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

import icalendar
from caldav.davclient import DAVClient
from caldav.lib import error as dav_error
from caldav.lib.http_sync import requests as http
from django.conf import settings

from agentloop.core.redaction import redact, url_secrets
from tools import fingerprint
from tools.builtin.calendar import CalendarBackend, EventData, event_dict
from tools.registry import OutcomeUnknown, Scope, ToolError

if TYPE_CHECKING:
    from caldav.calendarobjectresource import CalendarObjectResource
    from caldav.collection import Calendar, Principal

log = logging.getLogger(__name__)

SCOPE_PROPERTY = "X-AGENTLOOP-SCOPE"
PRODID = "-//agentloop//calendar tools//EN"
MUTATING_METHODS = {"PUT", "DELETE"}

_local = threading.local()

T = TypeVar("T")
# url, username, password, calendar name, timeout (seconds)
Config = tuple[str, str, str, str, float]


def _sync(value: T | Coroutine[Any, Any, T]) -> T:
    """caldav types a method once for its sync and its async client; ours is sync (DAVClient)."""
    return cast(T, value)


def _config() -> Config:
    return (settings.AGENTLOOP_CALDAV_URL, settings.AGENTLOOP_CALDAV_USERNAME, settings.AGENTLOOP_CALDAV_PASSWORD,
            settings.AGENTLOOP_CALDAV_CALENDAR or "agentloop",
            settings.AGENTLOOP_CALDAV_TIMEOUT)


def forget_connections() -> None:
    """Drop this thread's cached client (the next call connects afresh)."""
    connection = getattr(_local, "connection", None)
    _local.connection = None
    if connection is not None:
        try:
            connection.client.close()
        except Exception:  # closing a broken session must not hide the real error
            log.debug("closing the CalDAV session failed", exc_info=True)


# --- errors ------------------------------------------------------------------------------


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _never_sent(exc: BaseException) -> bool:
    """The connection could not be made, so the request never reached the server."""
    if isinstance(exc, http.exceptions.ConnectTimeout):
        return True
    for link in _chain(exc):
        names = {cls.__name__ for cls in type(link).__mro__}
        # urllib3 (and urllib3-future, which niquests uses) raise NewConnectionError /
        # NameResolutionError when the TCP connection cannot be established.
        if names & {"NewConnectionError", "NameResolutionError", "ConnectTimeoutError"}:
            return True
        if isinstance(link, (ConnectionRefusedError, socket.gaierror)):
            return True
    return False


def _shown(url: object) -> str:
    """The server's URL as errors quote it: without user-info or query (either may carry
    credentials, and an error goes to the model, an invoke answer and a note)."""
    parts = urlsplit(str(url))
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()


def _safe(text: str, url: str) -> str:
    """An error text with the configured credentials masked, wherever the server's answer put them."""
    return redact(text, [settings.AGENTLOOP_CALDAV_PASSWORD or "", *url_secrets(url)])


def _network_problem(exc: BaseException, url: str) -> str:
    if isinstance(exc, http.exceptions.Timeout):
        return f"the calendar server at {url} did not answer in time"
    for link in _chain(exc):
        if isinstance(link, ConnectionRefusedError):
            return f"the calendar server at {url} refused the connection (is it running?)"
        if isinstance(link, socket.gaierror):
            return f"the calendar server's host in {url} could not be resolved"
    innermost = list(_chain(exc))[-1]
    return f"the connection to the calendar server at {url} failed ({str(innermost) or type(innermost).__name__})"


def _refusal(exc: dav_error.DAVError) -> str:
    if isinstance(exc, dav_error.AuthorizationError):
        return ("the calendar server refused our credentials or access "
                f"(HTTP {exc.status or '401/403'}); check AGENTLOOP_CALDAV_USERNAME/PASSWORD")
    status = f"HTTP {exc.status}" if exc.status else type(exc).__name__
    # caldav puts the server's answer in `reason`, or (for a failed PUT) in `url`.
    detail = exc.reason if exc.reason and exc.reason != "no reason" else str(exc.url or "")
    detail = " ".join(detail.split())[:300]
    return f"the calendar server refused the request ({status}{': ' + detail if detail else ''})"


def _call(fn: Callable[[], T], *, url: str, mutating: bool = False,
          expected: type[Exception] | tuple[type[Exception], ...] = ()) -> T:
    """Run one caldav operation, translating its failures into ToolError / OutcomeUnknown
    (except the caldav errors in `expected`, which the caller handles)."""
    try:
        return fn()
    except expected:
        raise
    except http.exceptions.RequestException as exc:
        forget_connections()
        problem = _safe(_network_problem(exc, _shown(url)), url)
        request = getattr(exc, "request", None)
        method = (getattr(request, "method", None) or "").upper()
        # A write that may have reached the server: only a lookup can tell.
        if mutating and not _never_sent(exc) and (method in MUTATING_METHODS or not method):
            raise OutcomeUnknown(f"{problem} while the {method or 'write'} request was in flight") from exc
        raise ToolError(problem) from exc
    except dav_error.DAVError as exc:
        forget_connections()
        raise ToolError(_safe(_refusal(exc), url)) from exc


# --- the connection ------------------------------------------------------------------------


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "agentloop"


class _Connection:
    def __init__(self, config: Config) -> None:
        url, username, password, name, timeout = config
        if not url:
            raise ToolError("the CalDAV calendar is not configured (AGENTLOOP_CALDAV_URL is empty)")
        self.url, self.name = url, name
        credentials: dict[str, Any] = {"username": username, "password": password} if username else {}
        # caldav annotates the timeout int; it hands it to requests, which takes float seconds.
        self.client = DAVClient(url=url, timeout=timeout, **credentials)  # type: ignore[arg-type]
        try:
            self.calendar = _call(self._find_or_make, url=url)
        except Exception:
            self.client.close()
            raise

    def _find_or_make(self) -> Calendar:
        principal: Principal = self.client.principal()  # type: ignore[no-untyped-call]  # unannotated in caldav
        try:
            return _sync(principal.calendar(name=self.name))
        except dav_error.NotFoundError:
            pass
        log.info("creating the CalDAV calendar %r at %s", self.name, _shown(self.url))
        try:
            # A fixed collection id: two processes creating it at once hit the same URL,
            # and the loser finds the winner's calendar below instead of making a twin.
            return _sync(principal.make_calendar(name=self.name, cal_id=_slug(self.name)))
        except dav_error.DAVError:
            try:
                return _sync(principal.calendar(name=self.name))
            except dav_error.NotFoundError:
                raise ToolError(f"the calendar {self.name!r} does not exist on {_shown(self.url)} "
                                "and could not be created") from None


def _connection() -> _Connection:
    config = _config()
    connection = getattr(_local, "connection", None)
    if connection is None or _local.config != config:
        forget_connections()
        connection = _Connection(config)
        _local.connection, _local.config = connection, config
    return connection


# --- iCalendar ---------------------------------------------------------------------------


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=fingerprint.default_zone())
    return moment.astimezone(UTC)


def _as_datetime(value: Any) -> datetime | None:
    """A DTSTART/DTEND as an aware UTC datetime (dates and floating times: the default zone)."""
    if value is None:
        return None
    return _as_moment(value)


def _as_moment(value: Any) -> datetime:
    """A DTSTART/DTEND that is there (an iCalendar property, its `dt` a date or datetime): `_as_datetime`."""
    value = getattr(value, "dt", value)
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime.combine(value, time())
    return _utc(value)


def _mailto(address: str) -> str:
    address = address.strip()
    return address if address.lower().startswith("mailto:") else f"mailto:{address}"


def _address(attendee: object) -> str:
    text = str(attendee)
    return text[7:] if text.lower().startswith("mailto:") else text


def to_ical(scope: Scope, uid: str, data: EventData) -> str:
    event = icalendar.Event()
    event.add("UID", uid)
    event.add("DTSTAMP", datetime.now(UTC))
    event.add("SUMMARY", data.title)
    event.add("DTSTART", _utc(data.start))
    if data.end is not None:
        event.add("DTEND", _utc(data.end))
    if data.location:
        event.add("LOCATION", data.location)
    if data.description:
        event.add("DESCRIPTION", data.description)
    for attendee in data.attendees:
        event.add("ATTENDEE", icalendar.vCalAddress(_mailto(attendee)))
    event.add(SCOPE_PROPERTY, scope.key)
    calendar = icalendar.Calendar()
    calendar.add("PRODID", PRODID)
    calendar.add("VERSION", "2.0")
    calendar.add_component(event)
    encoded: bytes = calendar.to_ical()
    return encoded.decode()


def _vevent(obj: CalendarObjectResource) -> icalendar.Component | None:
    """The event's main VEVENT (not a recurrence override), or None."""
    try:
        parsed = icalendar.Calendar.from_ical(obj.get_data())
    except ValueError:
        log.warning("unparseable calendar object at %s", obj.url)
        return None
    events = parsed.walk("VEVENT")
    return next((e for e in events if "RECURRENCE-ID" not in e), events[0] if events else None)


def _scope_of(vevent: icalendar.Component) -> str | None:
    value = vevent.get(SCOPE_PROPERTY)
    return str(value) if value is not None else None


def _as_dict(vevent: icalendar.Component, calendar_name: str) -> dict[str, Any]:
    attendees = vevent.get("ATTENDEE") or []
    if not isinstance(attendees, list):
        attendees = [attendees]
    # A VEVENT without DTSTART would give None here and fail in event_dict (unchanged, noted in issue 52).
    data = EventData(title=str(vevent.get("SUMMARY", "")),
                     start=_as_datetime(vevent.get("DTSTART")),  # type: ignore[arg-type]
                     end=_as_datetime(vevent.get("DTEND")), attendees=[_address(a) for a in attendees],
                     location=str(vevent.get("LOCATION", "")), description=str(vevent.get("DESCRIPTION", "")))
    return event_dict(str(vevent.get("UID")), data, calendar_name)


# --- the backend -----------------------------------------------------------------------------


class CalDAVCalendar(CalendarBackend):
    def create(self, scope: Scope, uid: str, data: EventData) -> dict[str, Any]:
        connection = _connection()
        ical = to_ical(scope, uid, data)
        try:
            _call(lambda: connection.calendar.add_event(ical, no_overwrite=True), url=connection.url, mutating=True,
                  expected=dav_error.ConsistencyError)
        except dav_error.ConsistencyError:
            # The UID is taken. In this scope, it is this create having happened already.
            existing = self.find(scope, uid)
            if existing is not None:
                return existing
            raise ToolError(f"the calendar already has another event with the id {uid!r}") from None
        return event_dict(uid, data, connection.name)

    def _lookup(self, connection: _Connection, scope: Scope,
                uid: str) -> tuple[CalendarObjectResource, icalendar.Component] | None:
        """(caldav object, VEVENT) of the scope's event with this UID, or None."""
        try:
            obj = _call(lambda: _sync(connection.calendar.get_event_by_uid(uid)), url=connection.url,
                        expected=dav_error.NotFoundError)
        except dav_error.NotFoundError:
            return None
        vevent = _vevent(obj)
        if vevent is None or _scope_of(vevent) != scope.key:
            return None
        return obj, vevent

    def find(self, scope: Scope, uid: str) -> dict[str, Any] | None:
        connection = _connection()
        found = self._lookup(connection, scope, uid)
        return _as_dict(found[1], connection.name) if found else None

    def list(self, scope: Scope, start_from: datetime | None, start_to: datetime | None,
             limit: int = 50) -> list[dict[str, Any]]:
        connection = _connection()
        window: dict[str, Any] = {}  # caldav search()'s start and end
        if start_from is not None:
            window["start"] = _utc(start_from)
        if start_to is not None:
            window["end"] = _utc(start_to)
        objects: list[CalendarObjectResource] = _call(lambda: _sync(connection.calendar.search(event=True, expand=False, **window)),
                        url=connection.url)
        events: list[tuple[datetime, str, icalendar.Component]] = []
        for obj in objects:
            vevent = _vevent(obj)
            if vevent is None or _scope_of(vevent) != scope.key or vevent.get("DTSTART") is None:
                continue
            start = _as_moment(vevent.get("DTSTART"))
            # The server matches events *overlapping* the window; we list those starting in it.
            if ("start" in window and start < window["start"]) or ("end" in window and start >= window["end"]):
                continue
            events.append((start, str(vevent.get("UID")), vevent))
        events.sort(key=lambda item: (item[0], item[1]))
        return [_as_dict(vevent, connection.name) for _, _, vevent in events[:limit]]

    def delete(self, scope: Scope, uid: str) -> bool:
        connection = _connection()
        found = self._lookup(connection, scope, uid)
        if found is None:
            return False
        _call(lambda: found[0].delete(), url=connection.url, mutating=True)
        return True
