"""The API's error format and its requests held exactly to the schema, shared by every
app's API views (conversations, tools, audit) and kept apart from them (DRF imports the
exception handler from settings before its views module is ready). The agents' key
authentication is conversations' (conversations/api_auth.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views import defaults
from rest_framework import exceptions, serializers  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse
    from rest_framework.request import Request  # type: ignore[import-untyped]


class ErrorSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    """The shape of every API error."""

    error = serializers.CharField()
    fields = serializers.DictField(required=False, help_text="Per-field messages of an invalid request.")


def json_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every API error is JSON with a clear message."""
    from rest_framework.views import (  # type: ignore[import-untyped]
        exception_handler,  # not at import time: DRF loads us from settings
    )

    if isinstance(exc, RequestDataTooBig):
        return Response({"error": "request body too large"}, status=413)
    response = exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"error": str(response.data["detail"])}
    elif response is not None:
        response.data = {"error": "invalid request", "fields": response.data}
    return response


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404: a path under /api/ that matches no route (a path converter that does
    not fit, say `turns/-1/claim`) answers in the API's error shape, like every other API
    error; the rest of the site keeps Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": f"no such path: {request.path[:200]}"}, status=404)
    return defaults.page_not_found(request, exception)


# --- request fields exactly as the schema states them -----------------------------------------
# drf-spectacular writes a field's type, bounds and pattern; DRF's fields accept more than
# that (a number for a string, "true" for a boolean, a length counted after trimming). An
# API that external agents generate clients from must accept exactly what its schema says:
# the schema side is in conversations/schema.py, the code side here.

# Every character str.strip() removes (str.isspace), spelled out: JSON Schema's \s (ECMA)
# is a different set from Python's.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# DRF refuses NUL in any text (PostgreSQL cannot store it).
NO_NUL = r"^[^\x00]*$"
# A trimmed text that may not be blank: no NUL, and something besides whitespace.
NOT_BLANK = rf"^[^\x00]*[^\x00{WHITESPACE}][^\x00]*$"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$")
ROW_ID_MAX = 2**63 - 1  # a BigAutoField's largest id


def text_pattern(field: serializers.Field) -> str | None:
    """The pattern a request's text field is held to, or None when it states its own."""
    if not isinstance(field, serializers.CharField) or isinstance(field, serializers.RegexField):
        return None
    return NOT_BLANK if field.trim_whitespace and not field.allow_blank else NO_NUL


NUL_IN_JSON = "A NUL character (U+0000) cannot be stored (PostgreSQL's JSON refuses it), in a key or a text."


def nul_free(value: object) -> bool:
    """True when no text of a JSON value (keys included) holds a NUL."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(nul_free(k) and nul_free(v) for k, v in value.items())
    if isinstance(value, list):
        return all(nul_free(v) for v in value)
    return True


def date_time_problem(value: object) -> str | None:
    """Why `value` is not an RFC 3339 date-time (the schema's `format: date-time`; DRF
    alone takes other spellings too), or None."""
    if not isinstance(value, str) or not RFC3339.match(value):
        return "Must be an RFC 3339 date-time (e.g. 2026-12-01T10:00:00Z)."
    return None


class UtcDateTimeField(serializers.DateTimeField):  # type: ignore[misc]  # DRF's classes are Any here
    """A date-time as UTC. One the schema allows but UTC cannot hold (0001-01-01T00:00+01:00
    is in year 0 there) is taken as UTC's first or last instant: the database stores and
    compares UTC, and would fail on it."""

    def to_internal_value(self, value: object) -> datetime:
        parsed: datetime = super().to_internal_value(value)
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            return (datetime.min if parsed.year == 1 else datetime.max).replace(tzinfo=UTC)


def _integral(value: object) -> bool:
    """A JSON integer: JSON Schema counts 1.0 as one too."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type_error(field: serializers.Field, value: object) -> str | None:
    """Why `value` is not of the JSON type the schema gives `field` (DRF would coerce it)."""
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "Must be a JSON boolean."
    if isinstance(field, serializers.IntegerField):
        return None if _integral(value) else "Must be a JSON integer."
    if isinstance(field, serializers.FloatField):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "Must be a JSON number."
    if isinstance(field, serializers.DateTimeField):
        return date_time_problem(value)
    if isinstance(field, (serializers.CharField, serializers.ChoiceField)):
        if not isinstance(value, str):
            return "Must be a JSON string."
        if isinstance(field, serializers.CharField) and field.max_length is not None and len(value) > field.max_length:
            # DRF counts after trimming; the schema's maxLength counts what was sent.
            return f"Ensure this field has no more than {field.max_length} characters."
        return None
    if isinstance(field, serializers.DictField) and not isinstance(value, dict):
        return "Must be a JSON object."
    if isinstance(field, (serializers.DictField, serializers.JSONField)):
        return None if nul_free(value) else NUL_IN_JSON
    if isinstance(field, serializers.ListField):
        if not isinstance(value, list):
            return "Must be a JSON array."
        for item in value:
            problem = _json_type_error(field.child, item)
            if problem:
                return f"Each item: {problem}"
    return None


# (Comments, not docstrings: drf-spectacular shows a serializer's docstring in the schema.)


class StrictBody(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    # A JSON request body held to its schema's types before DRF's own (lenient) checks.

    def to_internal_value(self, data: object) -> dict[str, Any]:
        if isinstance(data, dict):
            errors: dict[str, list[str]] = {}
            for name, field in self.fields.items():
                if name in data and not field.read_only and not (data[name] is None and field.allow_null):
                    problem = _json_type_error(field, data[name])
                    if problem:
                        errors[name] = [problem]
            if errors:
                raise serializers.ValidationError(errors)
            data = {name: int(value) if isinstance(value, float) and isinstance(self.fields.get(name),
                                                                                 serializers.IntegerField) else value
                    for name, value in data.items()}
        validated: dict[str, Any] = super().to_internal_value(data)
        return validated


class StrictQuery(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    # Query parameters held to the schema: a date-time is RFC 3339 (DRF takes more).

    def to_internal_value(self, data: Mapping[str, Any]) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        for name, field in self.fields.items():
            if isinstance(field, serializers.DateTimeField) and name in data:
                problem = date_time_problem(data[name])
                if problem:
                    errors[name] = [problem]
        if errors:
            raise serializers.ValidationError(errors)
        validated: dict[str, Any] = super().to_internal_value(data)
        return validated


def query_of(request: Request) -> dict[str, str]:
    """The query string as a plain dict: DRF reads a QueryDict like an HTML form, where
    `state=` means "not given" (its default); for the API it is the empty value it is."""
    return {name: request.query_params.getlist(name)[-1] for name in request.query_params}


def row_id(value: int, what: str) -> int:
    """A path's row id, or 404: beyond a BigAutoField no row exists (and SQLite cannot
    even compare such a number)."""
    if not 0 <= value <= ROW_ID_MAX:
        raise exceptions.NotFound(f"no {what} {value}")
    return value
