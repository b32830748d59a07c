"""Calendar tools: create, list and delete events in the contact's calendar.

Two backends: `local` (events in our database — visible in the admin and as an
iCalendar feed per calendar) and `caldav` (any CalDAV server: Nextcloud, Fastmail,
iCloud, Radicale…). An event's UID comes from the guard's claim, so an interrupted
create can be looked up afterwards (reconciled) instead of being guessed at.
"""

import abc
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, overload

from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import import_string

from tools import fingerprint
from tools.models import Calendar, CalendarEvent
from tools.registry import Effect, InvalidArguments, Scope, Tool, ToolCall, ToolError


@dataclass
class EventData:
    title: str
    start: datetime
    end: datetime | None = None
    attendees: list[str] = field(default_factory=list)
    location: str = ""
    description: str = ""


def event_dict(uid: str, data: EventData, calendar: str = "") -> dict[str, Any]:
    return {"event_id": uid, "title": data.title, "start": data.start.isoformat(),
            "end": data.end.isoformat() if data.end else None, "attendees": list(data.attendees),
            "location": data.location, "description": data.description, "calendar": calendar}


class CalendarBackend(abc.ABC):
    """What a calendar must do for the tools. `scope` is a registry.Scope."""

    @abc.abstractmethod
    def create(self, scope: Scope, uid: str, data: EventData) -> dict[str, Any]:
        """Write the event under this UID; return it as `event_dict`."""

    @abc.abstractmethod
    def find(self, scope: Scope, uid: str) -> dict[str, Any] | None:
        """The scope's event with this UID, or None (how an interrupted create is reconciled)."""

    @abc.abstractmethod
    def list(self, scope: Scope, start_from: datetime | None, start_to: datetime | None,
             limit: int = 50) -> list[dict[str, Any]]:
        """The scope's events starting in the range, by start."""

    @abc.abstractmethod
    def delete(self, scope: Scope, uid: str) -> bool:
        """True if it existed and is gone now."""


class LocalCalendar(CalendarBackend):
    @overload
    def _calendar(self, scope: Scope, create: Literal[True]) -> Calendar: ...
    @overload
    def _calendar(self, scope: Scope, create: bool = False) -> Calendar | None: ...

    def _calendar(self, scope: Scope, create: bool = False) -> Calendar | None:
        if create:
            calendar, _ = Calendar.objects.get_or_create(scope=scope.key, defaults={"name": scope.label or scope.key})
            return calendar
        return Calendar.objects.filter(scope=scope.key).first()

    def create(self, scope: Scope, uid: str, data: EventData) -> dict[str, Any]:
        calendar = self._calendar(scope, create=True)
        CalendarEvent.objects.create(calendar=calendar, uid=uid, title=data.title, start=data.start, end=data.end,
                                     attendees=data.attendees, location=data.location, description=data.description)
        return event_dict(uid, data, str(calendar))

    def _as_dict(self, event: CalendarEvent) -> dict[str, Any]:
        data = EventData(event.title, event.start, event.end, event.attendees, event.location, event.description)
        return event_dict(event.uid, data, str(event.calendar))

    def find(self, scope: Scope, uid: str) -> dict[str, Any] | None:
        event = CalendarEvent.objects.select_related("calendar").filter(calendar__scope=scope.key, uid=uid).first()
        return self._as_dict(event) if event else None

    def list(self, scope: Scope, start_from: datetime | None, start_to: datetime | None,
             limit: int = 50) -> list[dict[str, Any]]:
        events = CalendarEvent.objects.select_related("calendar").filter(calendar__scope=scope.key)
        if start_from:
            events = events.filter(start__gte=start_from)
        if start_to:
            events = events.filter(start__lt=start_to)
        return [self._as_dict(e) for e in events.order_by("start")[:limit]]

    def delete(self, scope: Scope, uid: str) -> bool:
        deleted, _ = CalendarEvent.objects.filter(calendar__scope=scope.key, uid=uid).delete()
        return bool(deleted)


BACKENDS = {"local": "tools.builtin.calendar.LocalCalendar", "caldav": "tools.builtin.caldav.CalDAVCalendar"}


def backend() -> CalendarBackend:
    name = settings.AGENTLOOP_CALENDAR_BACKEND
    chosen: type[CalendarBackend] = import_string(BACKENDS.get(name, name))
    return chosen()


@overload
def _moment(arguments: dict[str, Any], name: str, required: Literal[True]) -> datetime: ...
@overload
def _moment(arguments: dict[str, Any], name: str, required: bool = False) -> datetime | None: ...


def _moment(arguments: dict[str, Any], name: str, required: bool = False) -> datetime | None:
    value = arguments.get(name)
    if value in (None, ""):
        if required:
            raise InvalidArguments(f"{name} is required")
        return None
    try:
        return fingerprint.parse_moment(value)
    except ValueError as exc:
        raise InvalidArguments(f"{name}: {exc}") from None


def _uid(call: ToolCall) -> str:
    return f"{call.idempotency_key or uuid.uuid4()}@agentloop"


class CreateEvent(Tool):
    name = "calendar_create_event"
    description = ("Create an event in the user's calendar. Dates are ISO 8601; without a time zone they are "
                   "in the business's local time.")
    parameters = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 300},
            "start_datetime": {"type": "string", "description": "ISO 8601, e.g. 2026-12-01T10:00"},
            "end_datetime": {"type": "string", "description": "ISO 8601; default: one hour after the start"},
            "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 50},
            "location": {"type": "string", "maxLength": 300},
            "description": {"type": "string", "maxLength": 5000},
        },
        "required": ["title", "start_datetime"],
        "additionalProperties": False,
    }
    effect = Effect.CREATE
    fingerprint_fields = ("title", "start_datetime")
    normalizers = {"title": fingerprint.text, "start_datetime": fingerprint.instant}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = super().validate(arguments)
        start, end = _moment(arguments, "start_datetime", required=True), _moment(arguments, "end_datetime")
        if end is not None and end <= start:
            raise InvalidArguments("end_datetime must be after start_datetime")
        return arguments

    def event(self, arguments: dict[str, Any]) -> EventData:
        start = _moment(arguments, "start_datetime", required=True)
        end = _moment(arguments, "end_datetime") or start + timedelta(hours=1)
        return EventData(title=arguments["title"].strip(), start=start, end=end,
                         attendees=list(arguments.get("attendees") or []), location=arguments.get("location", ""),
                         description=arguments.get("description", ""))

    def run(self, call: ToolCall) -> dict[str, Any]:
        return backend().create(call.scope, _uid(call), self.event(call.arguments))

    def reconcile(self, call: ToolCall) -> dict[str, Any] | None:
        return backend().find(call.scope, _uid(call))


class ListEvents(Tool):
    name = "calendar_list_events"
    description = "List the user's calendar events (by default: from now on)."
    parameters = {
        "type": "object",
        "properties": {
            "start_from": {"type": "string", "description": "ISO 8601; default: now"},
            "start_to": {"type": "string", "description": "ISO 8601; default: no limit"},
        },
        "additionalProperties": False,
    }
    effect = Effect.READ

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = super().validate(arguments)
        _moment(arguments, "start_from"), _moment(arguments, "start_to")
        return arguments

    def run(self, call: ToolCall) -> dict[str, Any]:
        start_from = _moment(call.arguments, "start_from") or timezone.now()
        events = backend().list(call.scope, start_from, _moment(call.arguments, "start_to"))
        return {"events": events, "count": len(events)}


class DeleteEvent(Tool):
    name = "calendar_delete_event"
    description = "Delete one of the user's calendar events by its event_id (from calendar_list_events)."
    parameters = {
        "type": "object",
        "properties": {"event_id": {"type": "string", "minLength": 1, "maxLength": 200}},
        "required": ["event_id"],
        "additionalProperties": False,
    }
    effect = Effect.DELETE
    fingerprint_fields = ("event_id",)

    def run(self, call: ToolCall) -> dict[str, Any]:
        event_id = call.arguments["event_id"]
        if not backend().delete(call.scope, event_id):
            raise ToolError(f"no event {event_id!r} in this calendar")
        return {"deleted": event_id}

    def reconcile(self, call: ToolCall) -> dict[str, Any] | None:
        event_id = call.arguments["event_id"]
        return None if backend().find(call.scope, event_id) else {"deleted": event_id}
