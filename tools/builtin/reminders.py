"""reminder_create: the agent schedules a message to the user (a reminder, a
follow-up) in the conversation it is answering. Behind the guard: asked twice (the
same text for the same minute, in the same conversation) it is scheduled once.
The message goes out by itself (conversations.schedules, docs/schedules.md)."""

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from delivery.models import ScheduledMessage, ScheduleSource
from tools import fingerprint
from tools.registry import Effect, InvalidArguments, Tool, ToolCall, ToolError

MAX_AHEAD = timedelta(days=366)
MIN_REPEAT_MINUTES = 60


class CreateReminder(Tool):
    name = "reminder_create"
    description = ("Schedule a message to the user in this conversation, sent by itself at due_at (ISO 8601; "
                   "without a time zone, the business's local time). cancel_on_reply: drop it if the user "
                   "writes first (a follow-up).")
    parameters = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 4000},
            "due_at": {"type": "string", "description": "ISO 8601, e.g. 2026-12-01T09:00"},
            "repeat_every_minutes": {"type": "integer", "minimum": MIN_REPEAT_MINUTES, "maximum": 525600},
            "cancel_on_reply": {"type": "boolean"},
        },
        "required": ["text", "due_at"],
        "additionalProperties": False,
    }
    effect = Effect.CREATE
    # The scope is the conversation's contact; the identity, what is said and when.
    fingerprint_fields = ("text", "due_at")
    normalizers = {"text": fingerprint.text, "due_at": fingerprint.instant}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = super().validate(arguments)
        due = self.due(arguments)
        if due > timezone.now() + MAX_AHEAD:
            raise InvalidArguments("due_at: at most a year ahead")
        return arguments

    @staticmethod
    def due(arguments: dict[str, Any]) -> datetime:
        try:
            return fingerprint.parse_moment(arguments["due_at"])
        except ValueError as exc:
            raise InvalidArguments(f"due_at: {exc}") from None

    def run(self, call: ToolCall) -> dict[str, Any]:
        if call.scope.conversation_id is None:
            raise ToolError("reminder_create schedules into a conversation: call it from a turn")
        arguments = call.arguments
        minutes = arguments.get("repeat_every_minutes")
        row = ScheduledMessage.objects.create(
            conversation_id=call.scope.conversation_id, text=arguments["text"], due_at=self.due(arguments),
            repeat_every=timedelta(minutes=minutes) if minutes else None,
            cancel_on_reply=bool(arguments.get("cancel_on_reply")), source=ScheduleSource.AGENT)
        return self.described(row)

    def reconcile(self, call: ToolCall) -> dict[str, Any] | None:
        found = ScheduledMessage.objects.filter(
            conversation_id=call.scope.conversation_id, text=call.arguments["text"],
            due_at=self.due(call.arguments), source=ScheduleSource.AGENT).order_by("-id").first()
        return self.described(found) if found is not None else None

    @staticmethod
    def described(row: ScheduledMessage) -> dict[str, Any]:
        return {"schedule_id": row.pk, "due_at": row.due_at.isoformat(), "state": row.state,
                "cancel_on_reply": row.cancel_on_reply}
