"""Signed, expiring links to a stored file, for agents that live elsewhere (webhook and
pull agents get them in the turn's `media`) and for pages that show a thumbnail. The
link names the file and when it was signed, signed with SECRET_KEY (django.core.signing,
its own salt): it cannot be made for another file, and it stops working after
AGENTLOOP_MEDIA_URL_TTL seconds."""

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


def file_id_of(token: str) -> int:
    try:
        value = signing.TimestampSigner(salt=SALT).unsign_object(token, max_age=settings.AGENTLOOP_MEDIA_URL_TTL)
    except signing.SignatureExpired:
        raise LinkRefused(f"this link expired (links last {settings.AGENTLOOP_MEDIA_URL_TTL} s)") from None
    except signing.BadSignature:
        raise LinkRefused("this link is not valid") from None
    if not isinstance(value, dict) or not isinstance(value.get("f"), int):
        raise LinkRefused("this link is not valid")
    return value["f"]
