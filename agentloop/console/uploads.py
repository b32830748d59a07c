"""The playground's attachments: a file the person picks is uploaded over HTTP (a
multipart POST; the socket carries text only), stored by conversations.media.uploads
under its digest, and admitted as a media message of the person's web chat — its
caption in `text` — whose MediaRef the worker reads back (WebchatPlatform.fetch_media),
exactly as an API upload. The same people may upload as may use the playground's
socket: active staff who may change channels, into an active web chat channel."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.http import JsonResponse
from django.views.decorators.http import require_POST

from agentloop.console.consumers import MAX_TEXT, PLAYGROUND_PERMISSION, admit_sent, allowed
from conversations.ingest import Unstorable
from conversations.media import links, uploads
from conversations.models import Channel, InboundMessage
from conversations.platforms import webchat

if TYPE_CHECKING:
    from django.http import HttpRequest

    from conversations.ingest import MediaRef


def refused(why: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": why}, status=status)


@require_POST
def playground_upload(request: HttpRequest, slug: str) -> JsonResponse:
    """202 with what the socket's `admitted` says, and the file: its kind, name and a
    signed link (the page's thumbnail; 404 until the worker has read it back)."""
    if not allowed(request.user, PLAYGROUND_PERMISSION):
        return refused(f"the playground needs an active staff account with {PLAYGROUND_PERMISSION}", 403)
    channel = Channel.objects.active(slug, webchat.KIND)
    if channel is None:
        return refused(f"no active web chat channel '{slug}'", 404)
    # A body past AGENTLOOP_MAX_UPLOAD_BODY_BYTES never got here: the web server refused it
    # before it was read (agentloop/core/body_limit.py), declared or chunked.
    upload = request.FILES.get("file")
    if upload is None:
        return refused("send the file in a `file` part (multipart/form-data)")
    text = request.POST.get("text", "")
    if len(text) > MAX_TEXT:
        return refused(f"a caption is limited to {MAX_TEXT} characters")
    message_id = (request.POST.get("id") or str(uuid.uuid4()))[:64]
    try:
        media = uploads.stored_upload(channel, upload)
        admission = admit_sent(channel, request.user, text, message_id, media)
    except uploads.UploadRefused as exc:
        return refused(str(exc), exc.status)
    except Unstorable as exc:
        return refused(f"message refused: {exc}")
    return JsonResponse({"type": "admitted", "id": message_id, **admission,
                         "file": _file_of(channel, message_id, media)}, status=202)


def _file_of(channel: Channel, message_id: str, media: MediaRef) -> dict[str, Any] | None:
    file_id = (InboundMessage.objects.filter(channel=channel, platform_message_id=f"console:{message_id}")
               .values_list("media_file_id", flat=True).first())
    if file_id is None:
        return None
    return {"id": file_id, "kind": media.kind, "name": media.file_name, "url": links.path_for(file_id)}
