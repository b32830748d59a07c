"""Messages into api channels, their edits and their deletions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db.models import CharField
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import exceptions, serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.parsers import JSONParser, MultiPartParser  # type: ignore[import-untyped]
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import (
    NO_NUL,
    NOT_BLANK,
    ErrorSerializer,
    StrictBody,
    UtcDateTimeField,
)
from agentloop.core.idempotency import ApiView
from conversations import deletions, edits
from conversations.api.access import Conflict, channel_for_key
from conversations.ingest import Inbound, Unstorable, admit
from conversations.media import remote, uploads
from conversations.models import EditOutcome, InboundMessage
from conversations.platforms.api import KIND as API_KIND

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]


def _max_length(name: str) -> int:
    field = InboundMessage._meta.get_field(name)
    assert isinstance(field, CharField) and field.max_length is not None, f"{name} is a bounded CharField"
    return field.max_length


MESSAGE_ID_CHARS = min(_max_length(name) for name in ("platform_message_id", "reply_target"))


@extend_schema_field({"type": "string", "maxLength": remote.MAX_URL_CHARS, "pattern": remote.URL_PATTERN})
class MediaUrlField(serializers.CharField):  # type: ignore[misc]  # DRF's classes are Any here
    """An https URL of a file (conversations.media.remote.check_url: the schema's pattern
    is the same rule)."""

    def to_internal_value(self, data: object) -> str:
        value: str = super().to_internal_value(data)
        try:
            remote.check_url(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class InboundMessageSerializer(StrictBody):
    # The schema's own words for the rule `validate` enforces.
    schema_extra = {"anyOf": [{"required": ["text"], "properties": {"text": {"pattern": NOT_BLANK}}},
                              {"required": ["media_type"]}, {"required": ["media_url"]}]}

    message_id = serializers.CharField(max_length=MESSAGE_ID_CHARS)
    contact = serializers.CharField(max_length=100)
    text = serializers.CharField(allow_blank=True, default="", max_length=20000, trim_whitespace=False,
                                 help_text="Required, and not blank, unless the message has a `media_type`, a "
                                           "`media_url` or a file.")
    chat = serializers.CharField(max_length=100, required=False)
    sender_name = serializers.CharField(max_length=200, required=False, default="")
    language = serializers.CharField(
        max_length=16, required=False, default="",
        help_text="The sender's language (`es`, `pt-BR`), when your app knows it: what agentloop itself writes to "
                  "them (apologies, notices, command answers) is in it. Not given: the channel's language, else the "
                  "deployment's.")
    media_type = serializers.CharField(max_length=30, required=False, default="")
    media_url = MediaUrlField(
        max_length=remote.MAX_URL_CHARS, required=False, default="", trim_whitespace=False,
        help_text="An `https` URL of the message's file, fetched after the message is accepted (not while the "
                  "request waits), from public addresses only unless the channel's `allowed_media_hosts` names "
                  "the host. Not with a multipart file.")
    album = serializers.CharField(max_length=64, required=False, default="",
                                  help_text="Items sent as one album share it: they count as one message "
                                            "and keep the buffer open for the album window.")
    is_group = serializers.BooleanField(required=False, default=False)
    is_bot = serializers.BooleanField(
        required=False, default=False,
        help_text="The sender is a bot: its message makes a turn only if the channel's `allowed_bots` names the "
                  "contact; otherwise it is stored as context, never answered (docs/routing.md#bots).")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        with_file = self.context.get("with_file")
        if not data["text"].strip() and not data["media_type"] and not with_file and not data["media_url"]:
            raise serializers.ValidationError({"text": "a message needs text, a media_type or a media_url"})
        if with_file and data["media_url"]:
            raise serializers.ValidationError({"media_url": "a message carries one file: a media_url or an "
                                                            "uploaded file, not both"})
        return data


class AdmissionSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    duplicate = serializers.BooleanField()
    conversation = serializers.IntegerField(allow_null=True)
    message = serializers.IntegerField(allow_null=True)
    disposition = serializers.CharField()
    flush_at = serializers.DateTimeField(allow_null=True)
    flush_in = serializers.FloatField(allow_null=True, help_text="Seconds until the buffer flushes.")
    flush_reason = serializers.CharField(help_text="Planned: window, album, max_wait, max_messages, media.")
    window = serializers.CharField(help_text="Which window the message got: closed, greeting, open, neutral, "
                                             "media.")


def message_and_file(request: Request) -> tuple[Any, UploadedFile[bytes] | None]:
    """The message's JSON body and its uploaded file (or None). A multipart body carries
    the message as JSON in its `message` part (held to the same schema) and the file in
    `file`."""
    if not request.content_type.startswith("multipart/form-data"):
        return request.data, None
    raw = request.data.get("message")
    if isinstance(raw, UploadedFile):
        raw = raw.read(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1).decode("utf-8", "replace")
    try:
        body = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise exceptions.ParseError("a multipart message needs a `message` part: the message as a JSON object")
    upload = request.FILES.get("file")
    if upload is None:
        raise exceptions.ParseError("a multipart message needs a `file` part (send JSON for a message without one)")
    return body, upload


class ChannelMessagesView(ApiView):
    parser_classes = [JSONParser, MultiPartParser]

    # The schema lists the JSON body only: the multipart form (the same JSON in a part, the
    # file beside it) is described in words, as its `message` part has no OpenAPI type
    # that says "this JSON object, as a string".
    @extend_schema(request={"application/json": InboundMessageSerializer},
                   responses={202: AdmissionSerializer, 403: ErrorSerializer},
                   summary="Send a user's message into an api channel (buffered into the next turn)",
                   description="A file goes with it as multipart/form-data: the message as JSON in the `message` "
                               "part, the file in `file` (its kind, when `media_type` is not given, read from its "
                               "bytes). Or the file's `https` URL in `media_url`: fetched by a worker, never from a private, "
                               "loopback or link-local address unless the channel allows the host. 403: the key has "
                               "no access to the channel. 404: no active channel by that slug. 400: an invalid body "
                               "(a `media_url` not https or malformed), an empty file, or the "
                               "channel is not an `api` channel. "
                               "413: the file is over AGENTLOOP_MEDIA_MAX_BYTES.")
    def post(self, request: Request, slug: str) -> Response:
        channel = channel_for_key(request.user, slug, API_KIND)
        body, upload = message_and_file(request)
        incoming = InboundMessageSerializer(data=body, context={"with_file": upload is not None})
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        media = None
        if upload is not None:
            try:
                media = uploads.stored_upload(channel, upload, data["media_type"])
            except uploads.UploadRefused as refused:
                return Response({"error": str(refused)}, status=refused.status)
            data["media_type"] = media.kind
        elif data["media_url"]:
            media = remote.media_ref(data["media_url"], data["media_type"])
            data["media_type"] = media.kind
        try:
            admission = admit(channel, Inbound(
                platform_message_id=data["message_id"], chat_id=data.get("chat") or data["contact"],
                sender_id=data["contact"], text=data["text"], sender_name=data["sender_name"],
                media_type=data["media_type"], album_id=data["album"], is_group=data["is_group"],
                reply_target=data["message_id"], media=media, language=data["language"], is_bot=data["is_bot"],
            ))
        except Unstorable as exc:
            raise exceptions.ParseError(f"message refused: {exc}") from None
        flush_in = None
        if admission.flush_at is not None:
            flush_in = round(max(0.0, (admission.flush_at - timezone.now()).total_seconds()), 3)
        body = {
            "duplicate": admission.duplicate, "conversation": admission.conversation_id,
            "message": admission.message_id, "disposition": admission.disposition or "duplicate",
            "flush_at": admission.flush_at, "flush_in": flush_in,
            "flush_reason": admission.planned_reason, "window": admission.window_kind,
        }
        return Response(AdmissionSerializer(body).data, status=status.HTTP_202_ACCEPTED)


class MessageEditSerializer(StrictBody):
    # `text` is required although the method is PATCH (an edit replaces the whole text):
    # never partial, for DRF and for the schema (drf-spectacular marks a PATCH body's
    # serializer partial, which would show every field optional).
    @property
    def partial(self) -> bool:
        return False

    @partial.setter
    def partial(self, value: object) -> None:
        pass

    text = serializers.CharField(allow_blank=True, max_length=20000, trim_whitespace=False,
                                 help_text="The corrected text (as long as a new message may be).")
    edited_at = UtcDateTimeField(
        required=False, help_text="When the user edited it. An edit is applied once per (message, edited_at): "
                                  "send it to make a retry safe. Default: the time the request arrives.")


class EditResultSerializer(serializers.Serializer):  # type: ignore[misc]
    message = serializers.IntegerField(help_text="The edited message's row id.")
    conversation = serializers.IntegerField()
    duplicate = serializers.BooleanField(help_text="This edit (same edited_at) was applied before: nothing changed now.")
    outcome = serializers.ChoiceField(
        [o for o in EditOutcome.values if o != EditOutcome.IGNORED],
        help_text="buffered: corrected in the open buffer, its window re-armed; rerun: the turn holding it was "
                  "cancelled (interrupt strategy, no effect fired) and runs again with the corrected text; noted: "
                  "the agent's next turn gets a note of the edit; unchanged: same text; not_applied: the message "
                  "never reached a turn (a control command, rejected, dropped).")
    detail = serializers.CharField()
    turn = serializers.IntegerField(allow_null=True, help_text="The turn cancelled (rerun) or too late for (noted).")
    buffer = serializers.IntegerField(allow_null=True)
    flush_at = serializers.DateTimeField(allow_null=True, help_text="When the corrected buffer flushes.")


class DeletionResultSerializer(serializers.Serializer):  # type: ignore[misc]
    message = serializers.IntegerField(help_text="The deleted message's row id.")
    conversation = serializers.IntegerField()
    duplicate = serializers.BooleanField(help_text="The message was deleted before: nothing changed now.")
    outcome = serializers.ChoiceField(
        deletions.OUTCOMES,
        help_text="withdrawn: it left the open buffer, the rest of the burst still runs (its window re-planned); "
                  "no_turn: it was all the open buffer held, no turn runs; rerun: the turn holding it was "
                  "cancelled (interrupt strategy, no effect fired) and runs again without it; cancelled: the same, "
                  "with nothing left to run; noted: too late (an effect fired, another strategy, or the turn is "
                  "over), the agent's next turn is told and the text kept out of its prompt; not_applied: the "
                  "message never reached a turn (a control command, rejected, dropped), or a duplicate.")
    detail = serializers.CharField()
    turn = serializers.IntegerField(allow_null=True, help_text="The turn cancelled, or too late for (noted).")
    buffer = serializers.IntegerField(allow_null=True)
    flush_at = serializers.DateTimeField(allow_null=True, help_text="When the remaining burst flushes.")


MESSAGE_ID_PARAMETER = OpenApiParameter("message_id", {"type": "string", "maxLength": MESSAGE_ID_CHARS,
                                                       "pattern": NO_NUL}, OpenApiParameter.PATH,
                                        description="The `message_id` the message was POSTed with.")


class MessageEditView(ApiView):
    @extend_schema(
        parameters=[MESSAGE_ID_PARAMETER],
        request=MessageEditSerializer,
        responses={200: EditResultSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer,
                   404: ErrorSerializer, 409: ErrorSerializer},
        summary="Edit a message the user already sent (the corrected text counts)",
        description="The message is the one POSTed with this `message_id`. 404: no such message in the channel. "
                    "400: a malformed body or a text that cannot be stored (same bounds as a new message). "
                    "409: the channel ignores edits (its `edits` setting is `ignore`): the edit is recorded and "
                    "audited as ignored and changes nothing (a retry gets the same answer).")
    def patch(self, request: Request, slug: str, message_id: str) -> Response:
        channel = channel_for_key(request.user, slug, API_KIND)
        if len(message_id) > MESSAGE_ID_CHARS or "\x00" in message_id:
            raise exceptions.NotFound(f"no message '{message_id[:MESSAGE_ID_CHARS]}' in channel '{slug}'")
        incoming = MessageEditSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            result = edits.apply(channel, edits.Edit(platform_message_id=message_id, text=data["text"],
                                                     edited_at=data.get("edited_at") or timezone.now(),
                                                     source="api"))
        except Unstorable as exc:
            raise exceptions.ParseError(f"edit refused: {exc}") from None
        if result.outcome == edits.UNKNOWN:
            raise exceptions.NotFound(f"no message '{message_id}' in channel '{slug}'")
        if result.outcome == EditOutcome.IGNORED:
            raise Conflict(f"channel '{slug}' ignores edits (edits: ignore): the edit was recorded and changed nothing")
        return Response(EditResultSerializer({
            "message": result.message_id, "conversation": result.conversation_id, "duplicate": result.duplicate,
            "outcome": result.outcome, "detail": result.detail, "turn": result.turn_id, "buffer": result.buffer_id,
            "flush_at": result.flush_at}).data)

    @extend_schema(
        parameters=[MESSAGE_ID_PARAMETER], request=None,
        responses={200: DeletionResultSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        summary="Delete a message the user already sent (its text is withdrawn)",
        description="The user deleted the message POSTed with this `message_id` on their side. Inside its window "
                    "it leaves the burst (no turn at all if it was the only message); in a turn that fired no "
                    "effect, on an `interrupt` channel, the turn is cancelled and re-run without it; otherwise the "
                    "agent's next turn is told and the text is kept out of its prompt. Safe to retry: a second "
                    "DELETE answers `duplicate: true` and changes nothing. 404: no such message in the channel.")
    def delete(self, request: Request, slug: str, message_id: str) -> Response:
        channel = channel_for_key(request.user, slug, API_KIND)
        if len(message_id) > MESSAGE_ID_CHARS or "\x00" in message_id:
            raise exceptions.NotFound(f"no message '{message_id[:MESSAGE_ID_CHARS]}' in channel '{slug}'")
        result = deletions.apply(channel, deletions.Deletion(platform_message_id=message_id,
                                                             deleted_at=timezone.now(), source="api"))
        if result.outcome == deletions.UNKNOWN:
            raise exceptions.NotFound(f"no message '{message_id}' in channel '{slug}'")
        return Response(DeletionResultSerializer({
            "message": result.message_id, "conversation": result.conversation_id, "duplicate": result.duplicate,
            "outcome": result.outcome, "detail": result.detail, "turn": result.turn_id, "buffer": result.buffer_id,
            "flush_at": result.flush_at}).data)
