"""A reply's file offered in a personal chat: the message holding its FileConsentCard,
and the card's context read back when the person taps it (files.py: the flow). The
context is one token signed with SECRET_KEY (django.core.signing, its own salt) naming
the stored bytes and the channel and person it was offered to: a card altered, for
another channel or tapped by someone else names nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import signing
from microsoft_agents.activity import Activity, Attachment

from conversations.platforms.teams.activities import as_dict

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from delivery.attachments import OutboundFile

CONSENT = "application/vnd.microsoft.teams.card.file.consent"
SALT = "agentloop.teams.file-consent"


def consent_card(channel: Channel, chat_id: str, item: OutboundFile, caption: str) -> Activity:
    """The message asking the person in `chat_id` (a personal chat) to accept `item`:
    `caption` its text, a FileConsentCard its attachment."""
    token = signing.dumps({"c": channel.pk, "u": chat_id, "f": item.file, "n": item.name, "t": item.type,
                           "s": item.size}, salt=SALT, compress=True)
    # Teams' wire shape written as JSON, not the SDK's FileConsentCard: its module
    # (microsoft_agents.activity.teams) is a hundred more pydantic models, imported by every
    # web server and by a worker's first typing look (every platform's transport, on the
    # event loop): 75 ms of CPU there, measured, which cost a window its indicators.
    card = {"description": item.caption or item.name, "sizeInBytes": item.size,
            "acceptContext": {"file": token}, "declineContext": {"file": token}}
    fields: dict[str, Any] = {"type": "message", "attachments": [Attachment(content_type=CONSENT, name=item.name,
                                                                           content=card)]}
    if caption.strip():
        fields.update(text=caption, text_format="markdown")
    return Activity(**fields)


def offered(channel: Channel, context: object, chat_id: str) -> dict[str, Any] | None:
    """The file a card's context names, if the card is ours, for this channel and this
    person, and not older than the ledger keeps files; else None."""
    token = as_dict(context).get("file")
    if not isinstance(token, str):
        return None
    try:
        found = signing.loads(token, salt=SALT, max_age=settings.AGENTLOOP_RETAIN_LEDGER_DAYS * 86400)
    except signing.BadSignature:  # SignatureExpired included
        return None
    if not isinstance(found, dict) or found.get("c") != channel.pk or found.get("u") != chat_id or \
            not isinstance(found.get("f"), str) or not str(found["f"]).startswith(f"outbound/{channel.pk}/"):
        return None
    return found
