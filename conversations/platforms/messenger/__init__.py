"""Messenger and Instagram: Meta's Send API and webhooks, two kinds in one package.

The two are one protocol (the Messenger Platform; Instagram's messaging is built on it):
the same webhook shape under another `object` ("page" / "instagram"), the same
`/{id}/messages` endpoint, sender actions, quick replies and error envelope; they differ
in limits (a text: 2,000 characters / 1,000 bytes), a few error subcodes, Instagram's
story replies and mentions and its lack of uploads. One package keeps that one protocol
in one place; two kinds (two lines of PLATFORMS) keep the channels, their pacing budgets
and their docs apart. The Meta plumbing WhatsApp shares too (the verify handshake,
X-Hub-Signature-256, the Graph error codes, the HTTP exchange) is
conversations.platforms.meta.

- events.py: a webhook body into Inbound messages, Reactions and quick-reply Taps
- webhook.py: GET (the handshake) and POST (events), the steps of
  conversations.platforms.inbound; a Tap decided there
- transport.py: sending (the window and its message tag, quick replies, files, typing
  and mark_seen), the Graph error codes mapped

Neither has group chats: every chat is one person.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from django.core.management.base import OutputWrapper

    from conversations.models import Channel
    from conversations.platforms.messenger.webhook import MessengerWebhook
    from delivery.transports import Transport

TAGS = ("", "HUMAN_AGENT")


def check_account_id(value: Any) -> str:
    digits = str(value).strip()
    if not digits.isdigit():
        raise ValidationError(gettext("a numeric id (the Page's, or the Instagram account's), not a name"))
    return digits


def check_version(value: Any) -> str:
    if not re.fullmatch(r"v\d+\.\d+", str(value)):
        raise ValidationError(gettext("a Graph API version such as v23.0"))
    return str(value)


def meta_settings(account: Any, token: Any, per_second: float) -> dict[str, Setting]:
    return {
        "account_id": Setting(label=account, required_to_send=True, check=check_account_id,
                              help=_("Messages are sent to {api_base}/{api_version}/{account_id}/messages; the "
                                     "webhook's entries for other ids are ignored.")),
        "token": Setting(label=_("Token"), help=token, secret=True, required_to_send=True, option="--token"),
        "app_secret": Setting(label=_("App secret"), secret=True, required_to_receive=True,
                              help=_("The Meta app's secret: checks X-Hub-Signature-256 on every event.")),
        "verify_token": Setting(label=_("Verify token"), secret=True, required_to_receive=True,
                                help=_("Any string you choose; Meta sends it back when you register the webhook.")),
        "api_base": Setting(label=_("API base"), default="https://graph.facebook.com", check=check_url,
                            carries=("token",), help=_("Graph API root. Changing it asks for the token again.")),
        "api_version": Setting(label=_("API version"), default="v23.0", check=check_version,
                               help=_("Graph API version.")),
        "message_tag": Setting(label=_("Message tag"), default="", choices=TAGS,
                               help=_("Outside the 24-hour window a reply is refused; with HUMAN_AGENT it is sent "
                                      "again tagged (a person's reply, up to 7 days after the user's last message; "
                                      "the app needs Meta's Human Agent permission). Empty: refused.")),
        "public_url": Setting(label=_("Public URL"), default="", check=check_url,
                              help=_("This deployment's https address: reply files go as signed links Meta fetches "
                                     "(Instagram takes no uploads). Empty: uploaded (Messenger only).")),
        **pace_settings(per_second=per_second, chat_interval=0.0),
    }


class MessengerPlatform(Platform):
    kind = "messenger"
    label = "Messenger"
    has_buttons = True  # quick replies; a tap comes back as a message with its payload
    reply_window = timedelta(hours=24)  # the standard messaging window
    # The Send API takes 300 calls a second per Page for text; just below it.
    settings = meta_settings(_("Page ID"), _("A Page access token with pages_messaging (a system user's does not "
                                             "expire)."), per_second=250)
    environment = {"account_id": "MESSENGER_PAGE_ID", "token": "MESSENGER_PAGE_TOKEN",
                   "app_secret": "META_APP_SECRET", "verify_token": "MESSENGER_VERIFY_TOKEN"}
    subscribe = "messages, messaging_postbacks, message_reactions"

    def transport(self, channel: Channel) -> Transport:
        from conversations.platforms.messenger.transport import MessengerTransport

        return MessengerTransport(channel)

    def webhook(self) -> MessengerWebhook:
        from conversations.platforms.messenger.webhook import MessengerWebhook

        return MessengerWebhook(self)

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        """An attachment's bytes from the signed CDN URL the event carried (no token: the
        URL is the permission; it expires, so a late fetch is refused for good)."""
        from django.conf import settings

        from conversations.media.download import FileUnavailable, fetch_bytes

        if not ref.startswith(("https://", "http://")):
            raise FileUnavailable("not an attachment URL", permanent=True)
        return await fetch_bytes(ref, limit, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE)

    async def close_clients(self) -> None:
        from conversations.platforms import meta

        await meta.close_clients()

    def bootstrap(self, stdout: OutputWrapper | None) -> str:
        """With the four environment variables set, a channel answers with the demo agent."""
        values = {name: os.environ.get(variable, "") for name, variable in self.environment.items()}
        if not any(value for name, value in values.items() if name != "app_secret"):  # META_APP_SECRET is shared
            return ""
        missing = [self.environment[name] for name, value in values.items() if not value]
        if missing:
            return f"{self.label}: no channel, {', '.join(missing)} not set"
        self.demo_channel(self.kind, f"{self.label} (demo agent)", values)
        return (f"{self.label} channel '{self.kind}': set the Meta app's webhook to "
                f"https://<your public host>/webhooks/{self.kind}/{self.kind}/ (subscribe {self.subscribe})")


class InstagramPlatform(MessengerPlatform):
    kind = "instagram"
    label = "Instagram"
    # Instagram's Send API: 100 calls a second per account for text; just below it.
    settings = meta_settings(_("Instagram account ID"), _("A token with instagram_manage_messages (Facebook "
                                                          "Login: the linked Page's) or "
                                                          "instagram_business_manage_messages (Instagram Login)."),
                             per_second=90)
    environment = {"account_id": "INSTAGRAM_ACCOUNT_ID", "token": "INSTAGRAM_TOKEN",
                   "app_secret": "META_APP_SECRET", "verify_token": "INSTAGRAM_VERIFY_TOKEN"}
    subscribe = "messages, messaging_postbacks, message_reactions"

    def transport(self, channel: Channel) -> Transport:
        from conversations.platforms.messenger.transport import InstagramTransport

        return InstagramTransport(channel)
