"""The OpenAPI schema (drf-spectacular) true to what the API does: the agent-key scheme,
every error answer an operation can give (one shape, ErrorSerializer), and the real
constraints of request fields (agentloop/core/api.py holds the code to them)."""

import re

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from agentloop.core import idempotency
from agentloop.core.api import NO_NUL, NUL_IN_JSON, ROW_ID_MAX, ErrorSerializer, text_pattern

# Each operation's one tag, by its method and path: what a client does with it (the tags and
# their order: agentloop.wiring.API_TAGS). First match wins; an operation none matches keeps
# drf-spectacular's tag, which tests/unit/test_api_docs.py refuses.
ANY = r"^[A-Z]+ "  # any method
TAG_RULES = [  # matched against "METHOD /path"
    (ANY + r"/api/v1/channels/", "inbound"),
    (r"^GET /api/v1/conversations/\{conversation\}/messages$", "reading"),
    (ANY + r"/api/v1/audit/", "reading"),
    (ANY + r"/api/v1/conversations/\{conversation\}/stream$", "replies"),
    (ANY + r"/api/v1/(tools|actions)(/|$)", "tools and the guard"),
    (ANY + r"/api/v1/turns(/|$)", "turns"),
    (ANY + r"/api/v1/conversations/\{conversation\}/schedules$", "schedules"),
    (ANY + r"/api/v1/conversations/\{conversation\}/(takeover|reply|release)$", "takeover"),
    (ANY + r"/api/v1/operator/", "operators"),
]


def tag_for(method: str, path: str) -> str | None:
    operation = f"{method.upper()} {path}"
    return next((tag for rule, tag in TAG_RULES if re.search(rule, operation)), None)


def paths_in_tag_order(result, generator, request, public):
    """A postprocessing hook: the paths in the order of their tags (stable: within a tag, the
    URLconf's), so the schema reads as the docs page does, the inbound POST first."""
    order = {tag["name"]: n for n, tag in enumerate(result.get("tags", []))}

    def rank(item):
        tags = [tag for operation in item[1].values() if isinstance(operation, dict)
                for tag in operation.get("tags", [])]
        return min((order.get(tag, len(order)) for tag in tags), default=len(order))

    result["paths"] = dict(sorted(result["paths"].items(), key=rank))
    return result


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "conversations.api_auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "An agent key: the admin's Agent keys, or `manage.py createagentkey`."}


def _error(description):
    return OpenApiResponse(ErrorSerializer, description=description)


class ApiSchema(AutoSchema):
    """AutoSchema for /api/v1/: the answers every operation shares are documented on each
    one (an operation's own `responses` come first and may describe them better)."""

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if not self.path.startswith("/api/v1/"):
            return responses
        for code, answer in self._shared_errors().items():
            if code not in responses:
                responses[code] = self._get_response_for_code(answer, code, None, direction)
        return responses

    def _shared_errors(self) -> dict:
        errors = {}
        has_body = self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None
        if has_body or self._has_query() or self._idempotent():  # (a malformed Idempotency-Key too)
            errors["400"] = _error("Invalid request: `error` says why, `fields` which field (if one).")
        errors["401"] = _error("No agent key, or an unknown or revoked one (`Authorization: Bearer <key>`).")
        if self._path_has_parameters():
            errors["404"] = _error("Nothing by that id or name among this key's channels.")
        if has_body:
            errors["413"] = _error("Request body too large (DATA_UPLOAD_MAX_MEMORY_SIZE).")
            errors["415"] = _error("The body is not `application/json`.")
        if self._idempotent():
            errors["409"] = _error("A request with the same `Idempotency-Key` is still in flight: retry after "
                                   "`Retry-After` seconds.")
            errors["422"] = _error("This `Idempotency-Key` was used for another request (method, path or body).")
        errors["429"] = _error("Too many requests for this key (AGENTLOOP_API_RATE): retry after `Retry-After` "
                               "seconds.")
        return errors

    def get_tags(self):
        tag = tag_for(self.method, self.path)
        return [tag] if tag else super().get_tags()

    def _idempotent(self) -> bool:
        return self.method == "POST" and self.path.startswith("/api/v1/")

    def get_override_parameters(self):
        """Every POST takes an `Idempotency-Key` (agentloop/core/idempotency.py)."""
        parameters = super().get_override_parameters()
        if not self._idempotent():
            return parameters
        return [*parameters, OpenApiParameter(
            # Its format, `idempotency-key`, is ours: a value new to each request (the draft
            # leaves its spelling to the client), which a generator must know to make one.
            idempotency.HEADER, {"type": "string", "format": "idempotency-key", "minLength": 1,
                                 "maxLength": idempotency.MAX_KEY_CHARS}, OpenApiParameter.HEADER,
            description="Makes a retry safe (draft-ietf-httpapi-idempotency-key-header): a new value per "
                        "request, the same on its retries. The same key and request (method, path and body) "
                        "from this caller within 24 h answers the first answer again (`Idempotent-Replayed: "
                        "true`) without running anything; 5xx answers are not kept. Printable ASCII, 1-255 "
                        "characters, no space at either end; or the draft's quoted string ('\"...\"').")]

    def _has_query(self):
        return any(p.get("in") == "query" for p in self._get_parameters())

    def _path_has_parameters(self):
        return "{" in self.path

    def _resolve_path_parameters(self, variables):
        """Path ids are row ids: integers from 0 up to a BigAutoField's largest."""
        parameters = super()._resolve_path_parameters(variables)
        for parameter in parameters:
            if parameter["schema"].get("type") == "integer":
                parameter["schema"].update(minimum=0, maximum=ROW_ID_MAX)
        return parameters

    def _map_basic_serializer(self, serializer, direction):
        """A serializer's `schema_extra` (e.g. an `anyOf` saying which fields go together)
        joins its component: the rules its `validate` enforces, in the schema's words."""
        component = super()._map_basic_serializer(serializer, direction)
        return {**component, **getattr(serializer, "schema_extra", {})}

    def _insert_field_validators(self, field, schema):
        """drf-spectacular offers a blank-allowing field's "" as a second `oneOf` branch; when
        the pattern already admits "", "" would match both branches, which `oneOf` forbids."""
        super()._insert_field_validators(field, schema)
        branches = schema.get("oneOf")
        if (branches and len(branches) == 2 and branches[1] == {"type": "string", "maxLength": 0}
                and re.search(branches[0].get("pattern", "(?!)"), "")):
            schema.update(schema.pop("oneOf")[0])

    def _json_value(self):
        """A free-form JSON value as the API takes it: any, but no NUL in a text or a key."""
        ref = {"$ref": "#/components/schemas/JsonValue"}
        texts = {"type": "string", "pattern": NO_NUL}
        self.registry.register_on_missing(ResolvedComponent(
            name="JsonValue", type=ResolvedComponent.SCHEMA, object="JsonValue", schema={
                "description": NUL_IN_JSON,
                "anyOf": [texts, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
                          {"type": "array", "items": ref},
                          {"type": "object", "additionalProperties": ref, "propertyNames": texts}]}))
        return ref

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        meta = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction == "request" and isinstance(field, serializers.DictField):
            return {**meta, "additionalProperties": self._json_value(), "propertyNames": {"type": "string",
                                                                                          "pattern": NO_NUL}}
        if direction == "request" and isinstance(field, serializers.JSONField):
            return {"allOf": [self._json_value()], **{k: v for k, v in meta.items() if k == "description"}}
        if direction == "request" and "pattern" not in meta and meta.get("type") == "string" and "format" not in meta:
            pattern = text_pattern(field)
            if pattern:
                meta["pattern"] = pattern
        return meta
