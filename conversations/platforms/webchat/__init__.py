"""The site's own web chat (the console's playground): messages come in over the page's
websocket (agentloop.console.consumers), replies and "typing…" go out through the live groups
(transport.py), taps on a question's buttons come back over the same socket."""

from django.db import transaction
from django.utils.translation import gettext_lazy as _

from agentloop.core import live
from conversations.platforms.base import Platform

KIND = "webchat"


class WebchatPlatform(Platform):
    kind = KIND
    label = _("Web chat")  # the others are names, the same in every language
    has_buttons = True  # the page shows them and sends a tap back over its socket

    # The package's own modules are imported where they are used: each of them imports this
    # package (its __init__) first, and they import models and ingest, which the registry
    # that loads this class from settings must not pull in.
    def transport(self, channel):
        from conversations.platforms.webchat.transport import WebchatTransport

        return WebchatTransport(channel)

    async def fetch_media(self, channel, ref: str, limit: int) -> bytes:
        """A file the person attached in the playground is already ours (stored by the
        upload, agentloop.console.uploads): read back from this channel's own files."""
        from conversations.media.uploads import read_back

        return await read_back(channel, ref, limit)

    def question_decided(self, channel, confirmation, outcome: str, status: str) -> None:
        event = {"kind": "question_decided", "conversation": confirmation.conversation_id,
                 "token": confirmation.token, "text": outcome, "status": status}
        with transaction.atomic():
            live.publish([live.conversation_group(confirmation.conversation_id)], event)
