"""Files uploaded with a message: into an API channel (multipart: the message as JSON in
`message`, the file in `file`), or through the playground's web chat
(agentloop.console.uploads). The bytes are stored on the request path — they are in
hand — under the name the worker's fetch would give them (their digest), and the
message carries a MediaRef naming that name: the worker "fetches" it from our own
storage (`read_back`, the platform's fetch_media), so an upload is sniffed, stored once, transcribed
and shown to the agent exactly as a platform's file is."""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from conversations.ingest import MediaRef
from conversations.media import sniff
from conversations.media.download import FileUnavailable, mb

if TYPE_CHECKING:
    from django.core.files.uploadedfile import UploadedFile

    from conversations.models import Channel


class UploadRefused(Exception):
    def __init__(self, why: str, status: int = 400):
        super().__init__(why)
        self.status = status


def storage_name(channel_id: int, digest: str) -> str:
    """Where a file's bytes live: named by their digest, so the same bytes are one object."""
    return f"media/{channel_id}/{digest[:2]}/{digest}"


def store(channel_id: int, data: bytes) -> tuple[str, str]:
    """(storage name, digest) of these bytes, written to Django's default storage unless
    they are there already (a retry after a crash, the same file sent again)."""
    digest = hashlib.sha256(data).hexdigest()
    name = storage_name(channel_id, digest)
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(data))
    return name, digest


def own_prefix(channel_id: int) -> str:
    return f"media/{channel_id}/"


async def read_back(channel: Channel, ref: str, limit: int) -> bytes:
    """An uploaded file's bytes, from the storage, and only from this channel's own files."""
    if not ref.startswith(own_prefix(channel.pk)) or ".." in ref:
        raise FileUnavailable("not a file uploaded to this channel", permanent=True)

    def read() -> bytes:
        with default_storage.open(ref, "rb") as f:
            data: bytes = f.read(limit + 1)
            return data

    try:
        return await asyncio.to_thread(read)
    except FileNotFoundError:
        raise FileUnavailable("the uploaded file is gone from the storage", permanent=True) from None


def stored_upload(channel: Channel, upload: UploadedFile[bytes], kind: str = "") -> MediaRef:
    """Store an uploaded file (Django's UploadedFile) and name it for the message."""
    limit = settings.AGENTLOOP_MEDIA_MAX_BYTES
    assert upload.size is not None, "Django's upload handlers set the size of every file they make"
    if upload.size > limit:
        raise UploadRefused(f"the file is {mb(upload.size)}, over the {mb(limit)} a file may have", 413)
    if upload.size == 0:
        raise UploadRefused("the file is empty")
    data = upload.read(limit + 1)
    name, digest = store(channel.pk, data)
    mime = sniff.content_type(data)
    return MediaRef(key=f"upload:{digest}", ref=name, kind=kind or kind_of(mime),
                    declared_type=(upload.content_type or "")[:100], file_name=(upload.name or "")[:255],
                    declared_size=len(data))


def kind_of(mime: str) -> str:
    """A message's media kind from what the bytes are."""
    if sniff.is_image(mime):
        return "photo"
    return {"audio": "audio", "video": "video"}.get(mime.partition("/")[0], "document")
