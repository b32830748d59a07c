"""The platform registry: settings.AGENTLOOP_PLATFORMS maps a channel kind to its
Platform class by dotted path (the way AGENTLOOP_AGENTS and the tools are registered).
Adding a platform is one package here and one line in that setting; nothing else asks
which kind a channel is."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from django.apps import apps
from django.conf import settings
from django.urls import include, path
from django.utils.module_loading import import_string

from conversations.platforms.base import Platform, Poller, Setting

if TYPE_CHECKING:  # for annotations only
    from django.urls import URLPattern, URLResolver

    from conversations.models import Channel
    from delivery.transports import Transport

__all__ = ["Platform", "Poller", "Setting", "all_platforms", "choices", "close_clients", "get", "of", "pollers",
           "transport_for", "typing_kinds", "urlpatterns"]


class UnknownPlatform(LookupError):
    pass


@cache
def _registry() -> dict[str, Platform]:
    return {kind: import_string(path)() for kind, path in settings.AGENTLOOP_PLATFORMS.items()}


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
    """Channel.kind's choices (a callable, so the migration does not freeze them)."""
    return [(kind, platform.label) for kind, platform in _registry().items()]


def transport_for(channel: Channel) -> Transport:
    """The delivery.transports.Transport that sends this channel's replies."""
    return of(channel).transport(channel)


def typing_kinds() -> tuple[str, ...]:
    """The kinds whose transport can show "typing…" (the worker's typing look asks the
    database only about these)."""
    Channel = apps.get_model("conversations", "Channel")  # by name: conversations.models imports this module
    return tuple(kind for kind, platform in _registry().items()
                 if platform.transport(Channel(kind=kind)).supports_typing)


def pollers() -> dict[str, Poller]:
    """The platforms that fetch their updates, by kind (the worker runs them)."""
    return {kind: poller for kind, platform in _registry().items() if (poller := platform.poller()) is not None}


async def close_clients() -> None:
    """Every platform's HTTP clients opened on the running event loop, closed."""
    for platform in _registry().values():
        await platform.close_clients()


def urlpatterns() -> list[URLPattern | URLResolver]:
    """Every platform's webhook URLs, each under webhooks/<kind>/."""
    return [path(f"webhooks/{kind}/", include((platform.urls(), kind)))
            for kind, platform in _registry().items() if platform.urls()]
