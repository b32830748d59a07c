"""Microsoft Teams (an Azure Bot's messaging endpoint; the Microsoft 365 Agents SDK's
activity models, microsoft-agents-activity, for every activity read and written):
everything Teams means to agentloop.

- verify.py: the `Authorization: Bearer <JWT>` the Bot Connector sends with every
  activity, verified with PyJWT against the OpenID metadata and signing keys it names
  (issuer, audience = the bot's app id, expiry, the key by its id and its endorsement of
  the activity's channel, the `serviceUrl` claim against the activity's serviceUrl)
- activities.py: an activity into an Inbound message, an Edit (messageUpdate), a
  Deletion (messageDelete) or the reason it is only acknowledged
- webhook.py: the bot's messaging endpoint, /webhooks/teams/<slug>/
- media.py: an image pasted into a message, fetched from the Connector with the bot's
  token; a file sent in a personal chat, from its pre-authorised downloadUrl (no token)
- consent.py, files.py: a reply's files in a personal chat: the FileConsentCard, and on the person's
  accept (a `fileConsent/invoke`) the upload to their OneDrive, once, and the file's card
- transport.py: replies through the Bot Connector REST API (POST, PUT and DELETE on
  {serviceUrl}/v3/conversations/{id}/activities) with the app's client-credentials
  token, each HTTP answer mapped to the ledger's outcomes; typing activities; previews
  as one message edited in place (group chats and channels)
- streaming.py: Teams' native streaming in personal chats (streaminfo entities: the
  streaming updates, then the final that ends the stream)
- wire.py: where an activity goes, an activity as the Connector takes it, a question's card
- cards.py: a confirmation question as an Adaptive Card with Action.Execute buttons; the
  `adaptiveCard/action` invoke a tap sends decided exactly once and answered in the same
  request with the card that replaces the question

Identities: a message's dedup key is its activity id. A conversation is the Teams
conversation id with the sender's id; a channel thread is a conversation of its own
(`19:…@thread.tacv2;messageid=<root>`), so a reply into it stays in the thread. A
personal chat's chat id is the person's id (29:…): its conversation id (`a:…`, 130
characters and more) is longer than a chat id holds. Every message carries its
conversation reference (the serviceUrl it came from, the conversation id, the tenant) as
the Inbound's `address`, kept per chat (conversations.addresses) and used by every reply,
edit, typing and stream; a chat no activity came from yet goes to the `service_url`
setting, a personal one by the conversation the Connector's "create conversation" gives
back for the bot and the person (asked once per process). Personal
chats are always answered; group chats and channels are groups (the channel's
`group_replies`), a message addressed when it @mentions the bot (the mention's text taken
out of it).

Why not the SDK's hosting and its JwtTokenValidator/ConnectorClient: the validator picks
its JWKS URL from the token's issuer among Microsoft's hard-coded hosts (it cannot be
pointed at a local identity provider without patching the module) and checks neither the
issuer nor the serviceUrl claim; the connector client is aiohttp under the SDK's own
process model and raises on an error answer, losing the status and Retry-After the
ledger's outcomes are made of. So: the SDK's models, PyJWT for the token, httpx for the
calls (delivery.transports.Transport.exchange: one overall deadline, sent or not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from django.urls import URLPattern, URLResolver

    from conversations.models import Channel
    from conversations.platforms.teams.webhook import TeamsActivities
    from delivery.transports import Transport
    from tools.models import Confirmation

OPENID_METADATA = "https://login.botframework.com/v1/.well-known/openidconfiguration"
# The Bot Connector's global endpoint: Microsoft documents it for proactive messages in the
# public cloud; it routes to the tenant's region.
SERVICE_URL = "https://smba.trafficmanager.net/teams/"


class TeamsPlatform(Platform):
    kind = "teams"
    label = "Microsoft Teams"
    has_buttons = True  # Adaptive Cards' Action.Execute; a tap comes back as an adaptiveCard/action invoke
    settings = {
        "app_id": Setting(
            label=_("App ID"), required_to_send=True, required_to_receive=True,
            help=_("The Azure Bot's Microsoft App ID: the audience of the tokens Teams sends, and the "
                   "client id the replies' token is asked for.")),
        "app_password": Setting(
            label=_("Client secret"), secret=True, required_to_send=True, option="--app-password",
            help=_("A client secret of the bot's app registration (Certificates & secrets).")),
        "tenant_id": Setting(
            label=_("Tenant ID"),
            help=_("The app registration's tenant (a single-tenant bot). Empty: botframework.com.")),
        "openid_metadata_url": Setting(
            label=_("OpenID metadata URL"), default=OPENID_METADATA, check=check_url,
            help=_("Where the Bot Connector's issuer and signing keys are published.")),
        "token_url": Setting(
            label=_("Token URL"), check=check_url, carries=("app_password",),
            help=_("Where the replies' token is asked for (empty: the tenant's Entra token endpoint). "
                   "Changing it asks for the client secret again.")),
        "service_url": Setting(
            label=_("Service URL"), default=SERVICE_URL, check=check_url,
            help=_("The Bot Connector a message goes to when no activity of its chat came yet (a proactive "
                   "first message; replies go to the serviceUrl of the chat's last activity): Teams' global "
                   "endpoint, which routes to the tenant's region; a local one in tests.")),
        # Teams' documented limits for one bot: 7 messages a second, 8 in 2 s, 60 in 30 s
        # and 1800 an hour into one thread (the hour's is the tightest sustained: one every
        # 2 s), 50 a second across all conversations of the bot.
        **pace_settings(per_second=45.0, chat_interval=2.0),
    }

    # The package's own modules are imported where they are used: they import models and
    # ingest, which the registry that loads this class from settings must not pull in.
    def transport(self, channel: Channel) -> Transport:
        from conversations.platforms.teams.transport import TeamsTransport

        return TeamsTransport(channel)

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.teams.media import fetch_media

        return await fetch_media(channel, ref, limit)

    async def close_clients(self) -> None:
        from conversations.platforms.teams.transport import close_clients

        await close_clients()

    def webhook(self) -> TeamsActivities:
        from conversations.platforms.teams.webhook import TeamsActivities

        return TeamsActivities(self)

    def urls(self) -> list[URLPattern | URLResolver]:
        return list(self.webhook().urls())

    def question_decided(self, channel: Channel, confirmation: Confirmation, outcome: str, status: str) -> None:
        from conversations.platforms.teams.cards import question_decided

        question_decided(channel, confirmation, outcome)
