"""A person in the conversation, for helpdesk tools (an agent key of the conversation's
channel): take it over, reply as the person, give it back (conversations.handoff).
Each call is idempotent: taking over a held conversation, or giving back one the agent
holds, changes nothing and answers 200; a reply with a `key` already used answers the
first reply again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import ErrorSerializer, StrictBody
from agentloop.core.idempotency import ApiView
from conversations import handoff
from conversations.api.access import conversation_for_key

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]

    from conversations.models import Conversation


class HoldSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    conversation = serializers.IntegerField(source="pk")
    state = serializers.ChoiceField(["agent", "person"], help_text="Who answers now.")
    held_by = serializers.CharField(help_text="The person holding it (or who last did).")
    held_at = serializers.DateTimeField(allow_null=True)
    changed = serializers.BooleanField(help_text="False: it was so already (a repeated call).")


class PersonReplySerializer(StrictBody):
    text = serializers.CharField(max_length=4000, help_text="The person's reply, sent through the delivery ledger.")
    key = serializers.CharField(max_length=100, required=False, default="",
                                help_text="Idempotency key: a repeated call with the same key sends nothing more.")
    by = serializers.CharField(max_length=100, required=False, default="",
                               help_text="Who answers (shown to operators, never to the user).")


class PersonReplyResultSerializer(serializers.Serializer):  # type: ignore[misc]
    conversation = serializers.IntegerField(source="conversation_id")
    turn = serializers.IntegerField(source="pk", help_text="The reply, as a finished turn of the conversation.")
    text = serializers.CharField(source="reply_text")
    created = serializers.BooleanField(help_text="False: this key's reply was written before.")


def _who(request: Request, given: str = "") -> str:
    return given or f"api:{request.user.name}"


def _hold(conversation: Conversation, changed: bool) -> Response:
    conversation.refresh_from_db(fields=["state", "held_by", "held_at"])
    conversation.changed = changed  # type: ignore[attr-defined]  # for the serializer: no field of the model
    return Response(HoldSerializer(conversation).data)


class TakeoverView(ApiView):
    @extend_schema(request=None, responses={200: HoldSerializer, 404: ErrorSerializer},
                   summary="Hand the conversation to a person: the agent stops answering it")
    def post(self, request: Request, conversation: int) -> Response:
        found = conversation_for_key(request.user, conversation)
        return _hold(found, handoff.take_over(found.pk, _who(request)))


class ReleaseView(ApiView):
    @extend_schema(request=None, responses={200: HoldSerializer, 404: ErrorSerializer},
                   summary="Give the conversation back to the agent, with a note of what happened meanwhile")
    def post(self, request: Request, conversation: int) -> Response:
        found = conversation_for_key(request.user, conversation)
        return _hold(found, handoff.give_back(found.pk, _who(request)))


class PersonReplyView(ApiView):
    @extend_schema(request=PersonReplySerializer,
                   responses={202: PersonReplyResultSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
                   summary="Reply as the person holding the conversation (through the delivery ledger)")
    def post(self, request: Request, conversation: int) -> Response:
        found = conversation_for_key(request.user, conversation)
        body = PersonReplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            turn, created = handoff.reply(found.pk, data["text"], _who(request, data["by"]), key=data["key"])
        except handoff.NotHeld as exc:
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        turn.created = created  # type: ignore[attr-defined]  # for the serializer: no field of the model
        return Response(PersonReplyResultSerializer(turn).data, status=status.HTTP_202_ACCEPTED)
