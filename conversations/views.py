"""Views every platform shares. A platform's webhooks live in its own package
(conversations/platforms/<kind>/), mounted under /webhooks/<kind>/."""

from django.core.files.storage import default_storage
from django.http import FileResponse, Http404, JsonResponse

from conversations.media import for_agents, links
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
        file_id = links.file_id_of(token)
    except links.LinkRefused as refused:
        return JsonResponse({"error": str(refused)}, status=403)
    item = next(iter(for_agents.attachments([file_id])), None)
    if item is None or not item.readable:
        raise Http404("no stored file for this link")
    response = FileResponse(default_storage.open(item.storage_name, "rb"), content_type=item.content_type,
                            filename=item.file_name or None)
    # Private to whoever holds the link; a file's bytes never run as this site's content.
    response["Cache-Control"] = "private, max-age=300"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    response["X-Content-Type-Options"] = "nosniff"
    return response
