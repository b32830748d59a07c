"""The one way a lower layer reaches code of a higher one (docs/architecture.md,
"Pointing up"): a setting names the implementation by dotted path and the lower layer
resolves it here, the way Django resolves EMAIL_BACKEND.

The lower layer owns the interface — a `typing.Protocol` beside the code that calls it,
saying exactly what it needs — and the higher app implements it. No registration in an
AppConfig.ready(), no module global filled in later: import-linter sees no upward import
because there is none, and the setting is the one place that names both sides. The
settings that do this are listed in docs/architecture.md, each with its reason.

Resolved once per process: the settings are read at start-up and never change while it
runs (a test that overrides one starts a process of its own). Bounded: one entry per
setting name."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@cache
def named(setting: str) -> Any:
    """What `settings.<setting>` names by dotted path: a class, function or module attribute."""
    return import_string(getattr(settings, setting))


@cache
def instances(setting: str) -> dict[str, Any]:
    """`settings.<setting>` is {key: dotted path of a class}: one instance of each, by key
    (AGENTLOOP_PLATFORMS: one Platform per channel kind, shared by every layer)."""
    return {key: import_string(path)() for key, path in getattr(settings, setting).items()}


class NotNamed(LookupError):
    """A key the setting names no implementation for (a channel of a kind no longer registered)."""


def instance(setting: str, key: str) -> Any:
    """The instance `settings.<setting>` names for `key` (see `instances`)."""
    try:
        return instances(setting)[key]
    except KeyError:
        raise NotNamed(f"no {key!r} in settings.{setting}") from None


@cache
def each(setting: str) -> tuple[Any, ...]:
    """`settings.<setting>` is a list of dotted paths: what each names, in order."""
    return tuple(import_string(path) for path in getattr(settings, setting))
