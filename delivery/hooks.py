"""What delivery needs from the apps above it in the layer order (.importlinter), filled
in by those apps' `AppConfig.ready()` so that delivery imports neither:

- conversations.platforms: the transport that sends a channel's replies, and closing
  every platform's HTTP clients opened on an event loop;
- conversations.languages: the language a conversation's rows are written in (the
  recovery marker, added at send time, speaks the row's);
- tools.confirmations: the answer buttons of the questions among some ledger rows while
  their proposal is open (a question goes out with its buttons, and keeps them on the
  console after a page reload).

Channels are conversations' model: delivery reaches it by name (`channel_model()`), as
its foreign keys do.
"""

from django.apps import apps

from agentloop.core import languages

_platforms = None
_buttons_for_rows = None
_language_of = None


def register_platforms(platforms):
    """`platforms` has `transport_for(channel)` and `async close_clients()`."""
    global _platforms
    _platforms = platforms


def register_buttons(buttons_for_rows):
    """`buttons_for_rows(row_ids)` → {row id: [(label, data), …]}."""
    global _buttons_for_rows
    _buttons_for_rows = buttons_for_rows


def register_languages(language_of):
    """`language_of(conversation)` → the language a row written to it is in."""
    global _language_of
    _language_of = language_of


def language_of(conversation) -> str:
    """The conversation's language (conversations.languages); the deployment's before that
    app is ready."""
    return _language_of(conversation) if _language_of is not None else languages.default()


def _registered_platforms():
    if _platforms is None:
        raise RuntimeError("no platforms registered with delivery (conversations' app is not ready)")
    return _platforms


def transport_for(channel):
    """The delivery.transports.Transport that sends this channel's replies."""
    return _registered_platforms().transport_for(channel)


async def close_clients() -> None:
    """Every platform's HTTP clients opened on the running event loop, closed."""
    await _registered_platforms().close_clients()


def buttons_for_rows(row_ids) -> dict:
    """{ledger row id: buttons} for the questions among these rows still waiting for an answer."""
    return _buttons_for_rows(row_ids) if _buttons_for_rows is not None else {}


def channel_model():
    return apps.get_model("conversations", "Channel")
