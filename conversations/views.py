"""Views every platform shares. A platform's webhooks live in its own package
(conversations/platforms/<kind>/), mounted under /webhooks/<kind>/."""

from dataclasses import dataclass

from django.core.files.storage import default_storage
from django.http import FileResponse, Http404, HttpResponse, JsonResponse

from conversations.media import for_agents, links, sniff
from conversations.models import Channel


def healthz(request):
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})


def media_file(request, token):
    """A stored file, by its signed link (conversations.media.links): 403 for a link that
    is not ours or expired, 404 for a file that is not stored (never fetched, or erased).
    Served with the type sniffed from its bytes, never as a page of this site."""
    try:
        reply_file = links.outbound_of(token)
        item = ReplyFile(*reply_file) if reply_file else next(iter(for_agents.attachments([links.file_id_of(token)])),
                                                                None)
    except links.LinkRefused as refused:
        return JsonResponse({"error": str(refused)}, status=403)
    if item is None or not item.readable:
        raise Http404("no stored file for this link")
    small = thumbnail(item) if request.GET.get("thumbnail") and sniff.is_image(item.content_type) else None
    if small is not None:
        response = HttpResponse(small, content_type="image/jpeg")
    else:
        try:
            opened = default_storage.open(item.storage_name, "rb")
        except FileNotFoundError:  # its row says stored, its bytes are gone (erased, another disk)
            raise Http404("the file's bytes are no longer stored") from None
        response = FileResponse(opened, content_type=item.content_type, filename=item.file_name or None)
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
            return handle.read()


THUMBNAIL_SIDE = 160


def thumbnail(item) -> bytes | None:
    """A small JPEG of a stored image (the admin's list, the story page); None when
    Pillow cannot read it (the file itself is served instead)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(item.read())) as image:
            image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
            out = io.BytesIO()
            image.convert("RGB").save(out, "JPEG", quality=80)
            return out.getvalue()
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
