"""The platform registry: settings.AGENTLOOP_PLATFORMS maps a channel kind to its
Platform class by dotted path (the way AGENTLOOP_AGENTS and the tools are registered),
resolved once per process by agentloop.core.plugins — the same instances the layers
below reach through their own interfaces (delivery.transports.transport_for sends through
them, agentloop.core.redaction asks them which settings are secret). Adding a platform is
one package and one line in that setting; nothing else asks which kind a channel is
(docs/adding-a-platform.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.urls import include, path

from agentloop.core import plugins
from conversations.models import Channel
from conversations.platforms.base import Platform, Setting

if TYPE_CHECKING:  # for annotations only
    from collections.abc import Collection

    from django.urls import URLPattern, URLResolver

    from conversations.platforms.inbound import Connection

__all__ = ["Platform", "Setting", "all_platforms", "choices", "connections", "get", "of",
           "typing_kinds", "urlpatterns"]


class UnknownPlatform(plugins.NotNamed):
    pass


def _registry() -> dict[str, Platform]:
    found: dict[str, Platform] = plugins.instances("AGENTLOOP_PLATFORMS")
    return found


def all_platforms() -> list[Platform]:
    return list(_registry().values())


def get(kind: str) -> Platform:
    try:
        return _registry()[kind]
    except KeyError:
        raise UnknownPlatform(f"no platform '{kind}' (settings.AGENTLOOP_PLATFORMS)") from None


def of(channel: Channel) -> Platform:
    return get(channel.kind)


def choices() -> list[tuple[str, str]]:
    """Every kind an operator may choose and its platform's name (addchannel's --kind;
    Channel.kind's choices): the replays' sandbox is not one."""
    return [(kind, platform.label) for kind, platform in _registry().items() if platform.listed]


def typing_kinds() -> tuple[str, ...]:
    """The kinds whose transport can show "typing…" (the worker's typing look asks the
    database only about these)."""
    return tuple(kind for kind, platform in _registry().items()
                 if platform.transport(Channel(kind=kind)).supports_typing)


def connections(kinds: Collection[str] | None = None) -> list[Connection]:
    """What the worker keeps running, one per channel across all workers: the connections
    of the platforms that keep one open or poll (Telegram's getUpdates), run by
    conversations.platforms.connection. With `kinds`, only those platforms': a connection's
    module, and the client library it brings, is imported once a channel of its kind is
    there, not by every worker (Matrix's matrix-nio alone: 106 modules, 0.2 s of CPU)."""
    return [kept for kind, platform in _registry().items()
            if (kinds is None or kind in kinds) and (kept := platform.connection()) is not None]


def urlpatterns() -> list[URLPattern | URLResolver]:
    """Every platform's webhook URLs, each under webhooks/<kind>/."""
    return [path(f"webhooks/{kind}/", include((platform.urls(), kind)))
            for kind, platform in _registry().items() if platform.urls()]
