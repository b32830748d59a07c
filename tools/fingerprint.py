"""Semantic fingerprints: the fields that make an action *that* action, normalised so
that a restatement of the same order hashes the same (case, spacing, time zone), while
anything else about the call (an extra `end_datetime`, say) does not count."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils.dateparse import parse_date, parse_datetime


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    fields: list[str]
    material: dict[str, Any]


class Normalizer(Protocol):
    """A tool's `normalizers[field]`: the value that is hashed for that argument."""

    def __call__(self, value: Any, call: Any = None) -> Any: ...


def text(value: object, call: object = None) -> str | None:
    """Case-, width- and whitespace-insensitive text."""
    if value is None:
        return None
    return " ".join(unicodedata.normalize("NFKC", str(value)).casefold().split())


def digest_of(value: object, call: object = None) -> str | None:
    """A long text counts by its content; only the hash is kept (a corrected body is new)."""
    if value is None:
        return None
    normalised = " ".join(unicodedata.normalize("NFKC", str(value)).split())
    return "sha256:" + hashlib.sha256(normalised.encode()).hexdigest()[:32]


def addresses(value: object, call: object = None) -> list[str] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else str(value).replace(";", ",").split(",")
    return sorted({str(a).strip().casefold() for a in items if str(a).strip()})


def default_zone() -> ZoneInfo:
    return ZoneInfo(settings.AGENTLOOP_DEFAULT_TIME_ZONE)


def parse_moment(value: object) -> datetime:
    """An ISO date or date-time; a naive one is in the deployment's default time zone."""
    moment: datetime | None
    if isinstance(value, datetime):
        moment = value
    else:
        raw = str(value).strip()
        moment = parse_datetime(raw.replace(" ", "T", 1) if len(raw) > 10 else raw)
        if moment is None:
            day = parse_date(raw)
            if day is None:
                raise ValueError(f"{value!r} is not an ISO 8601 date or date-time")
            moment = datetime.combine(day, time())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=default_zone())
    return moment


def instant(value: object, call: object = None) -> str | None:
    """The same moment written in any zone or format hashes the same (to the minute)."""
    if value is None:
        return None
    try:
        moment = parse_moment(value)
    except ValueError:
        return text(value)
    return moment.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%MZ")


def canonical(value: Any) -> Any:
    """Generic canonical form: key-sorted objects, strings NFKC with spacing collapsed."""
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, str):
        return " ".join(unicodedata.normalize("NFKC", value).split())
    return value


def compute(action: str, fields: Sequence[str] | None, arguments: Mapping[str, Any],
            normalizers: Mapping[str, Normalizer], scope: object = None) -> Fingerprint:
    material: dict[str, Any]
    if fields:
        material = {}
        for name in fields:
            normalise = normalizers.get(name, lambda v, call=None: canonical(v))
            material[name] = normalise(arguments.get(name))
    else:
        fields, material = [], canonical(arguments)
    payload = json.dumps({"action": action, "identity": material}, sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False, default=str)
    return Fingerprint(hashlib.sha256(payload.encode()).hexdigest(), list(fields), material)
