"""Google Chat (an HTTP endpoint app; google-auth for the bearer token Google sends and
for the service account's access token, the Chat REST API for sending): everything
Google Chat means to agentloop.

- verify.py: the `Authorization: Bearer <JWT>` every request carries, verified with
  google-auth (`id_token.verify_token`) against Google's published certificates
  (fetched with a deadline, cached, fetched again for a key id they lack)
- events.py: an interaction event (MESSAGE, CARD_CLICKED, ADDED_TO_SPACE,
  REMOVED_FROM_SPACE) into an Inbound message or the reason it is ignored
- webhook.py: the app's endpoint, /webhooks/google_chat/<slug>/
- transport.py: replies through the Chat API (spaces.messages.create) with the service
  account's access token, each HTTP answer mapped to the ledger's outcomes
- cards.py: a confirmation question as a cards v2 button list, a click decided exactly
  once and answered in the same request (the message updated in place)
- media.py: a file uploaded with a message, downloaded with the app's token (media.download)

Identities: a message's dedup key is its resource name (`spaces/S/messages/M`), the same
in every redelivery. A conversation's chat is the space (`spaces/S`); in a space the reply
goes into the user's thread (`thread.name`), in a direct message into the DM itself.
Spaces are groups: which messages are answered is the channel's `group_replies`; a
message's mention flag is set from its annotations (events.addressed). Chat has no typing
indicator.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from django.urls import URLPattern, URLResolver

    from conversations.models import Channel
    from conversations.platforms.google_chat.webhook import GoogleChatEvents
    from delivery.transports import Transport
    from tools.models import Confirmation

API_BASE = "https://chat.googleapis.com/v1/"


def check_key(value: str | dict[str, Any]) -> str:
    """A Setting.check for the service account key: the JSON file Google Cloud's console
    gives (type service_account, client_email, private_key), stored as its text."""
    try:
        key = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise ValidationError(_("not JSON: paste the whole key file")) from None
    if not isinstance(key, dict) or key.get("type") != "service_account" \
            or not key.get("client_email") or not key.get("private_key"):
        raise ValidationError(_("not a service account key (type service_account, client_email, private_key)"))
    return value if isinstance(value, str) else json.dumps(value)


def check_audience(value: str) -> str:
    """The audience Google's tokens are checked for: the endpoint's URL or the project number."""
    value = str(value).strip()
    if value.startswith(("http://", "https://")):
        return check_url(value)
    if not value.isdigit():
        raise ValidationError(_("the app's HTTP endpoint URL or the Cloud project number"))
    return value


class GoogleChatPlatform(Platform):
    kind = "google_chat"
    label = "Google Chat"
    has_buttons = True  # cards v2 buttons; a click comes back as a CARD_CLICKED event
    settings = {
        "service_account_key": Setting(
            label=_("Service account key"), secret=True, required_to_send=True, check=check_key,
            help=_("The JSON key of the service account the app sends as (Chat API scope chat.bot).")),
        "audience": Setting(
            label=_("Audience"), required_to_receive=True, check=check_audience,
            help=_("What the app's Authentication Audience is in the Chat API configuration: the HTTP endpoint "
                   "URL (exactly as entered there) or the Cloud project number.")),
        "certs_url": Setting(
            label=_("Certificates URL"), check=check_url,
            help=_("Where Google's signing certificates are fetched (empty: Google's, by the audience).")),
        "api_base": Setting(
            label=_("API base"), default=API_BASE, check=check_url, carries=("service_account_key",),
            help=_("Chat API root; messages go to {api_base}{space}/messages. Changing it asks for the key again.")),
        "token_uri": Setting(
            label=_("Token URI"), check=check_url, carries=("service_account_key",),
            help=_("Where the access token is asked for (empty: the key's own token_uri, Google's). "
                   "Changing it asks for the key again.")),
        # Chat's documented write quotas (https://developers.google.com/workspace/chat/limits):
        # 60 writes a minute into one space (shared by every app in it: one a second), and
        # 3,000 message writes a minute per Cloud project (50 a second for the app).
        **pace_settings(per_second=45.0, chat_interval=1.0),
    }

    # The package's own modules are imported where they are used: they import models and
    # ingest, which the registry that loads this class from settings must not pull in.
    def transport(self, channel: Channel) -> Transport:
        from conversations.platforms.google_chat.transport import GoogleChatTransport

        return GoogleChatTransport(channel)

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.google_chat.media import fetch_media

        return await fetch_media(channel, ref, limit)

    async def close_clients(self) -> None:
        from conversations.platforms.google_chat.transport import close_clients

        await close_clients()

    def webhook(self) -> GoogleChatEvents:
        from conversations.platforms.google_chat.webhook import GoogleChatEvents

        return GoogleChatEvents(self)

    def urls(self) -> list[URLPattern | URLResolver]:
        return list(self.webhook().urls())

    def question_decided(self, channel: Channel, confirmation: Confirmation, outcome: str, status: str) -> None:
        from conversations.platforms.google_chat.cards import question_decided

        question_decided(channel, confirmation, outcome)
