"""Signed, expiring links to a stored file, for agents that live elsewhere (webhook and
pull agents get them in the turn's `media`) and for pages that show a thumbnail. The
link names the file and when it was signed, signed with SECRET_KEY (django.core.signing,
its own salt): it cannot be made for another file, and it stops working after
AGENTLOOP_MEDIA_URL_TTL seconds."""

from typing import Any

from django.conf import settings
from django.core import signing
from django.urls import reverse

SALT = "agentloop.media.link"


class LinkRefused(Exception):
    """The link is not one of ours, or it expired."""


def path_for(file_id: int) -> str:
    """The link's path (relative to agentloop's own address, as a turn's `reply_url`)."""
    token = signing.TimestampSigner(salt=SALT).sign_object({"f": int(file_id)})
    return reverse("media-file", kwargs={"token": token})


def path_for_outbound(storage_name: str, content_type: str, name: str) -> str:
    """A link to a file of a reply (delivery.attachments.OutboundFile: stored bytes with
    no row of their own), for a page that shows the reply (the web chat)."""
    token = signing.TimestampSigner(salt=SALT).sign_object({"o": storage_name, "t": content_type, "n": name})
    return reverse("media-file", kwargs={"token": token})


def _payload(token: str) -> dict[str, Any]:
    try:
        value = signing.TimestampSigner(salt=SALT).unsign_object(token, max_age=settings.AGENTLOOP_MEDIA_URL_TTL)
    except signing.SignatureExpired:
        raise LinkRefused(f"this link expired (links last {settings.AGENTLOOP_MEDIA_URL_TTL} s)") from None
    except signing.BadSignature:
        raise LinkRefused("this link is not valid") from None
    if not isinstance(value, dict):
        raise LinkRefused("this link is not valid")
    return value


def file_id_of(token: str) -> int:
    value = _payload(token)
    if not isinstance(value.get("f"), int):
        raise LinkRefused("this link is not valid")
    file_id: int = value["f"]
    return file_id


def outbound_of(token: str) -> tuple[str, str, str] | None:
    """(storage name, content type, file name) of a reply's file link; None for a link
    to a user's file (file_id_of)."""
    value = _payload(token)
    if "o" not in value:
        return None
    if not all(isinstance(value.get(k), str) for k in "otn") or not value["o"].startswith("outbound/"):
        raise LinkRefused("this link is not valid")
    return value["o"], value["t"], value["n"]
