"""Discord (the Gateway websocket in, the REST API out): everything Discord means to
agentloop.

- gateway.py: the Gateway session the worker holds per channel (IDENTIFY, heartbeats,
  RESUME from the stored session and sequence number, a new session after an invalid
  one), one holder per bot across workers and hosts (the channel's lease)
- inbound.py: MESSAGE_CREATE / MESSAGE_UPDATE / MESSAGE_DELETE into our Inbound, Edit
  and Deletion (a message's attachments into files to fetch); READY into the session a
  new holder resumes
- media.py: an attachment fetched from its CDN URL, capped and deadlined
- transport.py: replies (`POST /channels/{id}/messages`, threaded with
  `message_reference`), files (multipart), previews of a streamed reply (one message,
  edited), status reactions, typing, the rate-limit buckets and each error mapped to
  the ledger's outcomes
- buttons.py: a confirmation question's buttons (components), a tap decided once and
  its interaction answered

Identities: a message's dedup key is its Discord message id (a snowflake, unique
everywhere); a conversation's chat is the Discord channel — a DM, a guild channel, or a
thread (a channel of its own). Guild channels are groups: which messages are answered is
the channel's `group_replies` (mention by default: `mentions` holds the bot, or the
message replies to it); the others are kept as context (conversations.groups).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from conversations.platforms.discord.gateway import DiscordConnection
    from conversations.platforms.discord.transport import DiscordTransport
    from tools.models import Confirmation


class DiscordPlatform(Platform):
    kind = "discord"
    label = "Discord"
    has_buttons = True  # components; a tap comes back over the Gateway (INTERACTION_CREATE)
    settings = {
        "bot_token": Setting(label=_("Bot token"), secret=True, required_to_send=True, required_to_receive=True,
                             option="--token", help=_("The bot's token (Developer Portal → your application → Bot → "
                                                      "Reset Token): the Gateway and every REST call use it.")),
        "api_base": Setting(label=_("API base"), default="https://discord.com/api/v10", check=check_url,
                            carries=("bot_token",),
                            help=_("REST API root; the Gateway's address is asked of it (GET /gateway/bot). "
                                   "Changing it asks for the bot token again.")),
        # Discord: 50 requests a second per bot (global); about 5 messages per 5 s into one
        # channel (the route's bucket).
        **pace_settings(per_second=40.0, chat_interval=1.0),
    }

    # The package's modules are imported where they are used: they import models and
    # ingest, which the registry that loads this class from settings must not pull in.
    def transport(self, channel: Channel) -> DiscordTransport:
        from conversations.platforms.discord.transport import DiscordTransport

        return DiscordTransport(channel)

    def connection(self) -> DiscordConnection:
        from conversations.platforms.discord.gateway import DiscordConnection

        return DiscordConnection(self)

    def question_decided(self, channel: Channel, confirmation: Confirmation, outcome: str, status: str) -> None:
        from conversations.platforms.discord.buttons import question_decided

        question_decided(channel, confirmation, outcome)

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.discord.media import fetch_media

        return await fetch_media(channel, ref, limit)

    async def close_clients(self) -> None:
        from conversations.platforms.discord.transport import close_clients

        await close_clients()
