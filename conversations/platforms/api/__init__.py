"""The API channel: messages come in through the REST API (conversations.api, an agent
key per channel); replies are stored for the read API, or POSTed signed to the
channel's callback URL when it has one (transport.py)."""

import ipaddress
import re

from django.core.exceptions import ValidationError
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url

KIND = "api"
HOST_NAME = re.compile(r"[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*")


def check_hosts(value) -> list[str]:
    """A list of host names or addresses (or a string of them, separated by commas or
    spaces), lowercased."""
    names = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    cleaned = []
    for name in names:
        host = str(name).strip().strip("[]").lower()
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not HOST_NAME.fullmatch(host):
                raise ValidationError(gettext("not a host name: %(name)s (a name or an address, without scheme or "
                                              "port)") % {"name": repr(name)}) from None
        cleaned.append(host)
    return cleaned


class ApiPlatform(Platform):
    kind = KIND
    label = "API"
    user_can_confirm = False  # any key granted the channel posts as any contact, the asker included
    settings = {
        "callback_url": Setting(label=_("Callback URL"), check=check_url, help=_("Where replies are POSTed (HMAC-signed); empty: replies "
                                                                                 "are kept for the read API.")),
        "callback_secret": Setting(label=_("Callback secret"), secret=True, help=_("HMAC key the callback's requests are signed with.")),
        "allowed_media_hosts": Setting(label=_("Allowed media hosts"), default=(), check=check_hosts,
                                       help=_("Hosts whose `media_url` files are fetched even though they resolve to a "
                                              "private, loopback or link-local address (an internal file server); "
                                              "every other host must resolve to public addresses only.")),
    }

    def clean_settings(self, values):
        cleaned = super().clean_settings(values)
        if cleaned["callback_url"] and not cleaned["callback_secret"]:
            # Replies are never POSTed unsigned: the receiver could not tell ours from anyone's.
            raise ValidationError({"platform_settings": gettext(
                "callback_secret: a callback URL needs a callback secret: replies are signed with it (HMAC-SHA256), "
                "never sent unsigned.")})
        return cleaned

    def send_blocked(self, channel) -> str:
        values = channel.platform_settings or {}
        if values.get("callback_url") and not values.get("callback_secret"):
            return "the callback URL has no secret to sign with"
        return ""

    async def fetch_media(self, channel, ref: str, limit: int) -> bytes:
        """A file given by URL is fetched under the SSRF policy (conversations.media.remote,
        this channel's `allowed_media_hosts`). An uploaded file is already ours
        (conversations.media.uploads): read back from the storage, and only from this
        channel's own files."""
        from django.conf import settings

        from conversations.media.remote import fetch_url
        from conversations.media.uploads import read_back

        if ref.startswith("https://"):
            return await fetch_url(ref, limit, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE,
                                   (channel.platform_settings or {}).get("allowed_media_hosts") or ())
        return await read_back(channel, ref, limit)

    # The package's own modules are imported where they are used: each of them imports this
    # package (its __init__) first, and they import models and ingest, which the registry
    # that loads this class from settings must not pull in.
    def transport(self, channel):
        from conversations.platforms.api.transport import ApiCallbackTransport, StoredTransport

        if (channel.platform_settings or {}).get("callback_url"):
            return ApiCallbackTransport(channel)
        return StoredTransport(channel)
