"""SMS and MMS through Twilio: everything Twilio's Programmable Messaging means to agentloop.

- webhook.py: the incoming-message webhook (/webhooks/sms/<slug>/) and the status
  callback (/webhooks/sms/<slug>/status/), both checked with X-Twilio-Signature against
  the exact public URL Twilio called (the channel's `public_base` and the path); opt-out
  keywords (STOP, START)
- transport.py: replies through the Messages API with the `twilio` library (its client
  on our own httpx session: one overall deadline, not-sent told from ambiguous), each
  with a StatusCallback; a reply's files as one MMS (their signed links as MediaUrls);
  Twilio's error codes mapped to the ledger's outcomes
- segments.py: what a reply costs (GSM-7 or UCS-2, 153 or 67 characters a segment)
- media.py: an MMS's files fetched with the account's credentials

SMS has no groups, no typing, no edits, no reactions and no buttons: a question asking to
confirm an action is answered yes or no in words (tools.confirmations).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from django.urls import URLPattern, URLResolver

    from conversations.models import Channel
    from conversations.platforms.sms.transport import SmsTransport
    from conversations.platforms.sms.webhook import SmsWebhook

DEFAULT_API_BASE = "https://api.twilio.com"


def check_account_sid(value: str) -> str:
    value = str(value).strip()
    if not re.fullmatch(r"AC[0-9a-fA-F]{32}", value):
        raise ValidationError(gettext("an Account SID: AC and 32 hexadecimal digits (the Twilio Console's home page)"))
    return value


def check_sender(value: str) -> str:
    value = str(value).strip()
    if not re.fullmatch(r"\+[1-9]\d{6,14}|MG[0-9a-fA-F]{32}", value):
        raise ValidationError(gettext("a Twilio phone number in E.164 (+15551234567) or a Messaging Service SID (MG…)"))
    return value


def check_public_base(value: str) -> str:
    value = check_url(str(value).strip()).rstrip("/")
    if "?" in value or "#" in value:
        raise ValidationError(gettext("the public origin only (https://agent.example.com), no query"))
    return value


class SmsPlatform(Platform):
    kind = "sms"
    label = "SMS (Twilio)"
    has_buttons = False
    settings = {
        "account_sid": Setting(label=_("Account SID"), required_to_send=True, check=check_account_sid,
                               help=_("The Twilio account's SID (AC…), from the Console's home page.")),
        "auth_token": Setting(label=_("Auth token"), secret=True, required_to_send=True, required_to_receive=True,
                              option="--token",
                              help=_("The account's Auth Token: sends replies and checks X-Twilio-Signature on "
                                     "every request Twilio makes.")),
        "from_number": Setting(label=_("From"), required_to_send=True, check=check_sender,
                               help=_("The Twilio number replies come from (E.164, +15551234567), or a Messaging "
                                      "Service SID (MG…).")),
        "public_base": Setting(label=_("Public base URL"), required_to_receive=True, check=check_public_base,
                               help=_("This product's public origin exactly as Twilio calls it "
                                      "(https://agent.example.com): the signature covers the whole URL, so behind "
                                      "a proxy give the outside address, not the one the proxy forwards to.")),
        "api_base": Setting(label=_("API base"), default=DEFAULT_API_BASE, check=check_url, carries=("auth_token",),
                            help=_("Twilio's REST API root. Changing it asks for the auth token again.")),
        # A long code sends 1 message segment a second by default (toll-free 3, short code
        # 100): set yours. Twilio queues what goes faster rather than refusing it, and a
        # reply waiting in its queue is one the user waits for.
        **pace_settings(per_second=1.0, chat_interval=0.0),
    }

    def transport(self, channel: Channel) -> SmsTransport:
        from conversations.platforms.sms.transport import SmsTransport  # imports delivery's, loaded after the registry

        return SmsTransport(channel)

    def webhook(self) -> SmsWebhook:
        from conversations.platforms.sms.webhook import SmsWebhook  # imports ingest, which imports the models

        return SmsWebhook(self)

    def urls(self) -> list[URLPattern | URLResolver]:
        """The incoming-message webhook, and the status callback each reply names."""
        from conversations.platforms.sms.webhook import StatusCallback

        return [*super().urls(), *StatusCallback(self).urls()]

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.sms.media import fetch_media

        return await fetch_media(channel, ref, limit)

    async def close_clients(self) -> None:
        from conversations.platforms.sms.transport import close_clients

        await close_clients()
