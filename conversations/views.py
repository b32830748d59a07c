"""Views every platform shares. A platform's webhooks live in its own package
(conversations/platforms/<kind>/), mounted under /webhooks/<kind>/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.core.files.storage import default_storage
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.utils.html import escape

from conversations.media import for_agents, images, links, sniff
from conversations.models import Channel

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

    from conversations.media.for_agents import Attachment


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})


def media_file(request: HttpRequest, token: str) -> HttpResponseBase:
    """A stored file, by its signed link (conversations.media.links): 403 for a link that
    is not ours or expired, 404 for a file that is not stored (never fetched, or erased).
    Served with the type sniffed from its bytes, never as a page of this site."""
    try:
        reply_file = links.outbound_of(token)
        item: ReplyFile | Attachment | None = ReplyFile(*reply_file) if reply_file else next(iter(for_agents.attachments([links.file_id_of(token)])),
                                                                None)
    except links.LinkRefused as refused:
        return JsonResponse({"error": str(refused)}, status=403)
    if item is None or not item.readable:
        raise Http404("no stored file for this link")
    response: HttpResponseBase | None = thumbnail_response(item) if request.GET.get("thumbnail") and sniff.is_image(item.content_type) else None
    if response is None:
        try:
            opened = default_storage.open(item.storage_name, "rb")
        except FileNotFoundError:  # its row says stored, its bytes are gone (erased, another disk)
            raise Http404("the file's bytes are no longer stored") from None
        # An empty name is no name, as None was (FileResponse reads `filename or` the file's own).
        response = FileResponse(opened, content_type=item.content_type, filename=item.file_name)
    # Private to whoever holds the link; a file's bytes never run as this site's content.
    response["Cache-Control"] = "private, max-age=300"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    response["X-Content-Type-Options"] = "nosniff"
    return response


@dataclass(frozen=True)
class ReplyFile:
    """A file of a reply, as media_file serves it (a user's file is a for_agents.Attachment)."""

    storage_name: str
    content_type: str
    file_name: str
    readable: bool = True

    def read(self) -> bytes:
        with default_storage.open(self.storage_name, "rb") as handle:
            data: bytes = handle.read()
            return data


THUMBNAIL_SIDE = 160


def thumbnail(item: ReplyFile | Attachment) -> bytes | None:
    """A small JPEG of a stored image (the admin's list, the story page); None when
    Pillow cannot read it (the file itself is served instead). images.TooManyPixels for
    one too large to decode (the web process decodes it no more than a worker would)."""
    try:
        with images.opened(item.read(), fit=THUMBNAIL_SIDE * 2) as image:
            return images.as_jpeg(image, THUMBNAIL_SIDE, quality=80)
    except images.TooManyPixels:
        raise
    except (OSError, ValueError):
        return None


def thumbnail_response(item: ReplyFile | Attachment) -> HttpResponse | None:
    try:
        small = thumbnail(item)
    except images.TooManyPixels as exc:
        return too_large_placeholder(str(exc))
    return HttpResponse(small, content_type="image/jpeg") if small is not None else None


def too_large_placeholder(why: str) -> HttpResponse:
    """In place of a thumbnail: an image saying why there is none (an <img> shows it), 422."""
    text = escape(f"too large to show: {why}")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{THUMBNAIL_SIDE}" height="{THUMBNAIL_SIDE}">'
           f"<title>{text}</title><rect width=\"100%\" height=\"100%\" fill=\"#eee\"/>"
           f'<text x="8" y="84" font-size="14" fill="#555">too large to show</text></svg>')
    return HttpResponse(svg, status=422, content_type="image/svg+xml")
