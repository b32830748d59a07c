"""WhatsApp (Cloud API): everything Meta's WhatsApp Business Platform means to agentloop.

- inbound.py: a webhook notification (entries × changes × messages and statuses) into
  our Inbound messages and delivery receipts; the X-Hub-Signature-256 check
- webhook.py: GET (Meta's verification handshake) and POST (notifications), the
  steps of conversations.platforms.inbound
- transport.py: sending (threaded, split at 4,096; an approved template outside the
  24-hour window), typing, Graph error codes mapped to the ledger's outcomes

Replies go to {api_base}/{api_version}/{phone_number_id}/messages with the channel's
token. WhatsApp has no buttons here: a question asking to confirm an action is answered
yes or no in words (tools.confirmations).
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings
from delivery import templates

if TYPE_CHECKING:  # for annotations only
    from conversations.platforms.whatsapp.webhook import WhatsAppWebhook

ENVIRONMENT = {"token": "WHATSAPP_TOKEN", "phone_number_id": "WHATSAPP_PHONE_NUMBER_ID",
               "app_secret": "WHATSAPP_APP_SECRET", "verify_token": "WHATSAPP_VERIFY_TOKEN"}


def check_phone_number_id(value):
    value = str(value).strip()
    if not value.isdigit():
        raise ValidationError(gettext("the phone number's id (digits, from the app's WhatsApp > API Setup page), "
                                      "not the phone number itself"))
    return value


def check_version(value):
    if not re.fullmatch(r"v\d+\.\d+", str(value)):
        raise ValidationError(gettext("a Graph API version such as v23.0"))
    return str(value)


class WhatsAppPlatform(Platform):
    kind = "whatsapp"
    label = "WhatsApp"
    has_buttons = False
    reply_window = timedelta(hours=24)  # the customer-service window; outside it, templates only
    settings = {
        "phone_number_id": Setting(label=_("Phone number ID"), help=_("The business phone number's id (WhatsApp > API Setup)."),
                                   required_to_send=True, check=check_phone_number_id),
        "token": Setting(label=_("Token"), help=_("A permanent system-user access token with whatsapp_business_messaging."),
                         secret=True, required_to_send=True, option="--token"),
        "app_secret": Setting(label=_("App secret"), help=_("The Meta app's secret: checks X-Hub-Signature-256 on every notification."),
                              secret=True, required_to_receive=True),
        "verify_token": Setting(label=_("Verify token"), help=_("Any string you choose; Meta sends it back when you register the webhook."),
                                secret=True, required_to_receive=True),
        "api_base": Setting(label=_("API base"), default="https://graph.facebook.com", check=check_url, carries=("token",),
                            help=_("Graph API root; requests go to {api_base}/{api_version}/{phone_number_id}/messages. "
                                   "Changing it asks for the token again.")),
        "api_version": Setting(label=_("API version"), default="v23.0", check=check_version, help=_("Graph API version.")),
        # Outside the 24-hour window only approved templates go: a message that goes out by
        # itself (a scheduled one) is sent as this template, or waits for the user to write.
        "template_name": Setting(label=_("Template name"), check=templates.check_name,
                                 help=_("An approved template (WhatsApp Manager) for scheduled messages due outside "
                                        "the 24-hour window, e.g. appointment_reminder. Empty: they wait until the "
                                        "user writes.")),
        "template_language": Setting(label=_("Template language"), default="en_US", check=templates.check_language,
                                     help=_("The template's language code as Meta writes it (es, en_US, pt_BR).")),
        "template_fill": Setting(label=_("Template fill"), default=templates.FILL_TEXT, choices=templates.FILLS,
                                 help=_("How the scheduled text fills the template's body: 'text' — the text is "
                                        "{{1}}; 'lines' — each line is one parameter ({{1}}, {{2}}, …).")),
        # The Cloud API's default throughput is 80 messages/s per business number; its pair
        # limit (one user, code 131056) allows bursts and is met as a flood when it comes.
        **pace_settings(per_second=78, chat_interval=0.0),
    }

    def template_for(self, channel, text: str, chosen: dict) -> dict | None:
        """The schedule's own template fields over the channel's; None without a name."""
        name = chosen.get("name") or channel.setting("template_name")
        if not name:
            return None
        return templates.filled(name, chosen.get("language") or channel.setting("template_language"), text,
                                chosen.get("fill") or channel.setting("template_fill"))

    # The package's own modules are imported where they are used: each of them imports this
    # package (its __init__) first, and they import models and ingest, which the registry
    # that loads this class from settings must not pull in.
    def transport(self, channel):
        from conversations.platforms.whatsapp.transport import WhatsAppTransport

        return WhatsAppTransport(channel)

    async def fetch_media(self, channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.whatsapp.media import fetch_media

        return await fetch_media(channel, ref, limit)

    async def close_clients(self) -> None:
        from conversations.platforms.whatsapp.transport import close_clients

        await close_clients()

    def webhook(self) -> WhatsAppWebhook:
        from conversations.platforms.whatsapp.webhook import WhatsAppWebhook

        return WhatsAppWebhook(self)

    def bootstrap(self, stdout) -> str:
        """With WHATSAPP_TOKEN, WHATSAPP_PHONE_NUMBER_ID, WHATSAPP_APP_SECRET and
        WHATSAPP_VERIFY_TOKEN set, a `whatsapp` channel answers with the demo agent."""
        values = {name: os.environ.get(variable, "") for name, variable in ENVIRONMENT.items()}
        if not any(values.values()):
            return ""
        missing = [ENVIRONMENT[name] for name, value in values.items() if not value]
        if missing:
            return f"WhatsApp: no channel, {', '.join(missing)} not set"
        self.demo_channel("whatsapp", "WhatsApp (demo agent)", values)
        return ("WhatsApp channel 'whatsapp': set the Meta app's webhook to "
                "https://<your public host>/webhooks/whatsapp/whatsapp/ with verify token $WHATSAPP_VERIFY_TOKEN "
                "(subscribe the 'messages' field)")
