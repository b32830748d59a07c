"""REST API for external agents: hosted tools behind the guard, and the guard alone
(claim / succeed / fail) for tools an agent runs itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import exceptions, serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import ROW_ID_MAX, ErrorSerializer, StrictBody, row_id
from agentloop.core.idempotency import ApiView
from tools import guard, registry
from tools.conversation_side import conversation_side
from tools.mcp import catalog
from tools.models import ActionClaim
from tools.registry import Scope

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]


class ScopedSerializer(StrictBody):
    schema_extra = {"oneOf": [{"required": ["conversation"]}, {"required": ["scope"]}]}  # what `validate` says

    conversation = serializers.IntegerField(required=False, min_value=1, max_value=ROW_ID_MAX,
                                            help_text="A conversation id (its contact is the scope).")
    scope = serializers.CharField(required=False, max_length=150,
                                  help_text="An explicit scope of your own (e.g. a customer id), instead.")
    arguments = serializers.DictField(help_text="The call's arguments (a JSON object).")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if ("conversation" in data) == ("scope" in data):
            raise serializers.ValidationError("give exactly one of 'conversation' or 'scope'")
        return data


class InvokeSerializer(ScopedSerializer):
    pass


class ActionClaimSerializer(ScopedSerializer):
    action = serializers.RegexField(guard.GUARD_ONLY_NAME.pattern, trim_whitespace=False,
                                    help_text="Your action's name, 1-48 letters, digits, '_' or '-' (not a hosted "
                                              "tool's; names are yours alone, kept apart from other keys').")
    fingerprint = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, max_length=20,
        help_text="Argument names that make two calls the same action (default: the policy's, else all).",
    )


class OutcomeSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    status = serializers.ChoiceField(["done", "duplicate", "in_progress", "uncertain", "awaiting_approval", "failed"])
    duplicate = serializers.BooleanField()
    note = serializers.CharField(required=False, help_text="For the model: what happened and what to tell the user.")
    result = serializers.JSONField(required=False)
    original = serializers.JSONField(required=False, help_text="The original claim of a duplicate, with its result.")
    error = serializers.CharField(required=False)
    claim = serializers.IntegerField(required=False, allow_null=True)
    proposal = serializers.IntegerField(required=False)


class ClaimSerializer(serializers.Serializer):  # type: ignore[misc]
    claim = serializers.IntegerField()
    status = serializers.CharField()
    state = serializers.CharField()
    fingerprint = serializers.CharField()
    expires_at = serializers.DateTimeField()
    result = serializers.JSONField(required=False)


class ClaimOutcomeSerializer(StrictBody):
    result = serializers.JSONField(required=False, allow_null=True, default=None)


class ClaimFailureSerializer(StrictBody):
    error = serializers.CharField(max_length=2000)


def _scope(request: Request, data: dict[str, Any]) -> Scope:
    key = request.user
    if "conversation" in data:
        return Scope.of_conversation(conversation_side().conversation_for_key(key, data["conversation"]))
    return Scope.of_agent(key.pk, data["scope"])


def _actor(request: Request) -> str:
    return f"agent:{request.user.name}"[:100]


def _outcome_body(outcome: guard.Outcome) -> dict[str, Any]:
    body = outcome.for_model()
    body["claim"] = outcome.claim_id
    return body


class ToolListView(ApiView):
    @extend_schema(responses={200: serializers.ListSerializer(child=serializers.DictField())},
                   summary="The hosted tools, as OpenAI function definitions with their guard policy")
    def get(self, request: Request) -> Response:
        tools = []
        for name, tool in registry.all_tools().items():
            policy = guard.policy_for(name)
            if not policy.enabled:
                continue
            tools.append({**tool.as_function(), "effect": tool.effect.value,
                          "guarded": tool.guarded and policy.guarded, "approval": policy.approval,
                          # Kept for clients written before `approval`: true for operator and user.
                          "requires_approval": policy.requires_approval,
                          "window_seconds": policy.window_seconds})
        return Response(tools)


class ToolInvokeView(ApiView):
    @extend_schema(
        request=InvokeSerializer,
        responses={200: OutcomeSerializer, 202: OutcomeSerializer},
        summary="Run a hosted tool behind the action guard",
        description="A duplicate is a success: `duplicate: true`, a `note` for the model and the original "
                    "result. 202 when the tool needs a person's approval (a proposal was opened). "
                    "400: also when `arguments` do not fit the tool's `parameters` (GET /api/v1/tools). "
                    "404: no such tool, it is disabled, or no such conversation among the key's channels.",
        examples=[OpenApiExample("create an event", request_only=True, value={
            "conversation": 12, "arguments": {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}})],
    )
    def post(self, request: Request, name: str) -> Response:
        incoming = InvokeSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            tool = registry.get(name)
        except registry.UnknownTool as exc:
            raise exceptions.NotFound(str(exc)) from None
        scope = _scope(request, data)
        if not catalog.allowed(tool, scope):  # an MCP server's tool: only for its channels' conversations
            raise exceptions.NotFound(f"unknown tool {name!r}")
        try:
            outcome = guard.invoke(name, data["arguments"], scope, actor=_actor(request),
                                   agent_key_id=request.user.pk)
        except registry.InvalidArguments as exc:
            raise exceptions.ParseError(f"invalid arguments for {name}: {exc}") from None
        except guard.UserConfirmationUnavailable as exc:  # the tool exists; its policy cannot hold here
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        except guard.ToolDisabled as exc:
            raise exceptions.NotFound(str(exc)) from None
        code = status.HTTP_202_ACCEPTED if outcome.status == guard.Status.AWAITING_APPROVAL else status.HTTP_200_OK
        return Response(_outcome_body(outcome), status=code)


class ActionClaimView(ApiView):
    @extend_schema(
        request=ActionClaimSerializer,
        responses={201: ClaimSerializer, 200: OutcomeSerializer,
                   409: {"anyOf": [{"$ref": "#/components/schemas/Outcome"},
                                   {"$ref": "#/components/schemas/Error"}]},
                   404: ErrorSerializer, 429: ErrorSerializer},
        summary="Guard-only: claim an action before running it yourself",
        description="201: proceed — run the action, then call succeed or fail with the claim id. "
                    "200: a duplicate (or an interrupted identical action): do not run it; tell the user per "
                    "`note`. 409: an identical action is in progress right now, or the name is a hosted tool's "
                    "(run those through /tools/{name}/invoke). 404: no such conversation among the key's channels. "
                    "429: this key already uses AGENTLOOP_MAX_ACTIONS_PER_KEY action names (or too many requests).",
    )
    def post(self, request: Request) -> Response:
        incoming = ActionClaimSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        scope = _scope(request, data)
        try:
            outcome, created = guard.claim_action(data["action"], data["arguments"], scope,
                                                  fields=data.get("fingerprint"), actor=_actor(request),
                                                  agent_key_id=request.user.pk)
        except registry.InvalidArguments as exc:
            raise exceptions.ParseError(str(exc)) from None
        except guard.HostedToolName as exc:
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        except guard.TooManyActions as exc:
            return Response({"error": str(exc)}, status=status.HTTP_429_TOO_MANY_REQUESTS)
        if created:  # the claim was just taken: its id is set
            return Response(_claim_body(ActionClaim.objects.get(pk=outcome.claim_id), "proceed"),  # type: ignore[misc]
                            status=status.HTTP_201_CREATED)
        code = status.HTTP_409_CONFLICT if outcome.status == guard.Status.IN_PROGRESS else status.HTTP_200_OK
        return Response(_outcome_body(outcome), status=code)


def _claim_body(claim: ActionClaim, status_word: str) -> dict[str, Any]:
    body: dict[str, Any] = {"claim": claim.pk, "status": status_word, "state": claim.state, "fingerprint": claim.fingerprint,
            "expires_at": claim.expires_at}
    if claim.result is not None:
        body["result"] = claim.result
    return body


class _ClaimOutcomeView(ApiView):
    def _settle(self, request: Request, claim: int, settle: Callable[..., ActionClaim], payload: Any) -> Response:
        try:
            settled = settle(row_id(claim, "claim"), payload, agent_key_id=request.user.pk)
        except ActionClaim.DoesNotExist:
            raise exceptions.NotFound(f"no claim {claim}") from None
        except guard.ClaimConflict as exc:
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(_claim_body(settled, settled.state))


class ActionSucceedView(_ClaimOutcomeView):
    @extend_schema(request=ClaimOutcomeSerializer, responses={200: ClaimSerializer, 409: ErrorSerializer},
                   summary="Guard-only: the action succeeded (keeps its result for duplicates)")
    def post(self, request: Request, claim: int) -> Response:
        incoming = ClaimOutcomeSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        return self._settle(request, claim, guard.succeed, incoming.validated_data["result"])


class ActionFailView(_ClaimOutcomeView):
    @extend_schema(request=ClaimFailureSerializer, responses={200: ClaimSerializer, 409: ErrorSerializer},
                   summary="Guard-only: the action failed (the claim is released; a retry may run)")
    def post(self, request: Request, claim: int) -> Response:
        incoming = ClaimFailureSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        return self._settle(request, claim, guard.fail, incoming.validated_data["error"])
