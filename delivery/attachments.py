"""Files a reply carries (an image, the `.ics` of a booked event): each is a chunk of its
ledger row, so it inherits everything a text chunk has — written down before it is sent,
its start and delivery recorded around the send, resent with the recovery marker (in
its caption) only when its upload may have landed, never silently twice.

A file chunk is `{"files": [file, …]}` in the row's `chunks` (JSON), each file
`{"file": storage name, "name", "type", "size", "caption"}`: the bytes live in Django's
default storage under their digest (written before the row, outside its transaction),
so a resend after a crash uploads the same bytes again. Several images in a row go as
one album where the platform has them (Telegram's sendMediaGroup: `Transport.max_album`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from delivery import chunks

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# One of a row's chunks (OutboundMessage.chunks): a text, or a file chunk {"files": […]}.
Chunk = str | dict[str, Any]

IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp")


@dataclass(frozen=True)
class OutboundFile:
    """One stored file of a reply, as its chunk names it."""

    file: str  # the storage name of its bytes
    name: str  # the file name the user sees ("booking.ics")
    type: str  # its content type, read from its bytes by whoever stored it
    size: int
    caption: str = ""

    @property
    def is_image(self) -> bool:
        return self.type in IMAGE_TYPES

    @classmethod
    def of(cls, value: dict[str, Any]) -> OutboundFile:
        return cls(str(value["file"]), str(value.get("name") or "file"), str(value.get("type") or ""),
                   int(value.get("size") or 0), str(value.get("caption") or ""))


def store(channel_id: int, data: bytes) -> str:
    """The storage name of these bytes, written unless they are there already (the same
    file attached twice, a turn's answer written down again after a lost connection)."""
    digest = hashlib.sha256(data).hexdigest()
    name = f"outbound/{channel_id}/{digest[:2]}/{digest}"
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(data))
    return name


def read(name: str) -> bytes:
    """A stored file's bytes (blocking: called from a thread)."""
    with default_storage.open(name, "rb") as handle:
        data: bytes = handle.read()
    return data


def is_files(piece: object) -> TypeIs[dict[str, Any]]:
    """Whether a row's chunk is a file chunk (else it is text)."""
    return isinstance(piece, dict) and "files" in piece


def files_of(piece: dict[str, Any]) -> list[OutboundFile]:
    return [OutboundFile.of(value) for value in piece["files"]]


def file_chunks(files: list[OutboundFile], max_album: int, caption_units: int) -> list[dict[str, Any]]:
    """The chunks that send `files` in order: consecutive images grouped up to
    `max_album` (a platform's album), everything else one chunk each. Captions cut to
    what the platform takes with room for the recovery marker (`caption_units`)."""
    found: list[list[OutboundFile]] = []
    for item in files:
        item = OutboundFile(item.file, item.name, item.type, item.size, _cut(item.caption, caption_units))
        last = found[-1] if found else None
        if last and item.is_image and all(f.is_image for f in last) and len(last) < max_album:
            last.append(item)
        else:
            found.append([item])
    return [{"files": [asdict(item) for item in group]} for group in found]


def _cut(caption: str, limit: int) -> str:
    if chunks.units(caption) <= limit:
        return caption
    return chunks.split(caption, limit)[0]


def listed(pieces: Iterable[Chunk] | None) -> list[str]:
    """A row's files in words, in order (the story page, the admin): `cita.ics (text/plain, 1 KB)`."""
    return [f"{item.name} ({item.type or '?'}, {max(1, round(item.size / 1024))} KB)"
            for piece in pieces or () if is_files(piece) for item in files_of(piece)]


def describe(piece: dict[str, Any]) -> str:
    """A file chunk in words (the admin, a platform without files)."""
    return ", ".join(f"📎 {item.name}" for item in files_of(piece))


def stored_names(pieces: Iterable[Chunk] | None) -> set[str]:
    """The storage names of the files a row's chunks carry."""
    return {item.file for piece in pieces or () if is_files(piece) for item in files_of(piece)}
