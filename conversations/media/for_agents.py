"""What a turn's agent receives of the files in its burst: `Attachment`s, in the
burst's order. The OpenAI-compatible agent turns them into content parts (`parts`):
an image as an `image_url` data URL (downscaled first when large), a text or PDF
document by name and type with its text, a voice note with its transcript (when a
transcription server is configured: conversations.media.transcribe), anything else — or a file that could not be
read — described in a line, so the model knows what was sent and what it did not see."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage

from conversations.media import images, links, sniff, transcribe
from conversations.media.download import mb
from conversations.models import InboundMessage, MediaFile, MediaState, MessageBuffer

if TYPE_CHECKING:
    from conversations.models import Turn

DOCUMENT_TEXT_CHARS = 20000


@dataclass(frozen=True)
class Attachment:
    id: int
    kind: str
    state: str
    content_type: str = ""
    file_name: str = ""
    size: int | None = None
    duration: float | None = None
    problem: str = ""
    storage_name: str = ""
    transcript: str = ""

    @property
    def readable(self) -> bool:
        return self.state == MediaState.STORED and bool(self.storage_name)

    def read(self) -> bytes:
        with default_storage.open(self.storage_name, "rb") as f:
            data: bytes = f.read()
            return data


def file_ids_of_turn(turn: Turn) -> list[int]:
    """The files of the messages merged into `turn` — and of the interrupted turns whose
    input it carries (conversations.flushing.merge) — in arrival order, each once."""
    ids = (InboundMessage.objects.filter(buffer_id__in=list(input_buffers([turn.buffer_id])), media_file__isnull=False)
           .order_by("received_at", "pk").values_list("media_file_id", flat=True))
    return list(dict.fromkeys(ids))


def input_buffers(buffer_ids: Iterable[int | None]) -> dict[int, int]:
    """{buffer id: the one of `buffer_ids` whose turn's input it is}: each buffer, and
    those whose cancelled turn's input it carries (an interrupt: MessageBuffer.
    carried_turn), and theirs, in turn. One query per interrupt in a row."""
    found = {pk: pk for pk in buffer_ids if pk}
    step = list(found)
    for _ in range(100):  # each step follows one interrupt: a finite chain
        carried = (MessageBuffer.objects.filter(pk__in=step, carried_turn__isnull=False)
                   .values_list("pk", "carried_turn__buffer_id")) if step else []
        step = []
        for pk, earlier in carried:
            if earlier is not None and earlier not in found:
                found[earlier] = found[pk]
                step.append(earlier)
        if not step:
            break
    return found


def attachments(ids: Sequence[int]) -> list[Attachment]:
    rows = {f.pk: f for f in MediaFile.objects.filter(pk__in=ids)}
    return [attachment_of(f) for pk in dict.fromkeys(ids) if (f := rows.get(pk)) is not None]


def attachment_of(f: MediaFile) -> Attachment:
    return Attachment(id=f.pk, kind=f.kind, state=f.state, content_type=f.content_type, file_name=f.file_name,
                      size=f.size if f.size is not None else f.declared_size, duration=f.duration,
                      problem=f.problem, storage_name=f.storage_name, transcript=f.transcript)


def for_remote(item: Attachment) -> dict[str, Any]:
    """What an agent in another service gets of a file (a webhook agent's POST, a pull
    agent's turn): its facts, and a signed, expiring link to its bytes once stored."""
    return {"id": item.id, "kind": item.kind, "state": item.state, "content_type": item.content_type,
            "file_name": item.file_name, "size": item.size, "duration": item.duration,
            "transcript": item.transcript, "problem": item.problem, "description": describe(item),
            "url": links.path_for(item.id) if item.readable else None}


def of_turn(turn: Turn) -> list[Attachment]:
    """The files of a turn, as they stand (none asked for when it carries none)."""
    return attachments(file_ids_of_turn(turn)) if turn.has_media else []


def seen_by_turns(turns: Iterable[Turn]) -> dict[int, str]:
    """{turn id: the lines describing its files} for earlier turns (history): one query
    for all of them. A transcript comes with its line; images and documents are not sent
    again."""
    turn_of = {turn.buffer_id: turn.pk for turn in turns if turn.buffer_id}
    if not turn_of:
        return {}
    by_buffer = {pk: turn_of[own] for pk, own in input_buffers(list(turn_of)).items()}  # with carried input
    lines: dict[int, list[str]] = {}
    shown: set[tuple[int, int]] = set()
    for message in (InboundMessage.objects.filter(buffer_id__in=list(by_buffer), media_file__isnull=False)
                    .select_related("media_file").order_by("received_at", "pk")):
        buffer_id, file = message.buffer_id, message.media_file
        assert buffer_id is not None and file is not None, "the filter reads messages with both"
        turn_id = by_buffer[buffer_id]
        if (turn_id, file.pk) in shown:
            continue
        shown.add((turn_id, file.pk))
        item = attachment_of(file)
        line = describe(item)
        lines.setdefault(turn_id, []).append(f"{line}\n{item.transcript}" if item.transcript else line)
    return {pk: "\n".join(found) for pk, found in lines.items()}


def describe(item: Attachment, why_not: str = "") -> str:
    """One line about a file: what it is, and why the model does not see it, if so."""
    what = {"voice": "voice note", "video_note": "video note"}.get(item.kind, item.kind)
    facts = [f"'{item.file_name}'" if item.file_name else "", item.content_type,
             mb(item.size) if item.size else "", f"{item.duration:g} s" if item.duration else ""]
    line = f"[{what}: {', '.join(f for f in facts if f)}]" if any(facts) else f"[{what}]"
    if not why_not:
        why_not = _why_unread(item)
    return f"{line[:-1]}; {why_not}]" if why_not else line


def _why_unread(item: Attachment) -> str:
    if item.state == MediaState.SKIPPED:
        return f"not read: {item.problem or 'not fetched'}"
    if item.state == MediaState.FAILED:
        return f"could not be read: {item.problem or 'the platform did not give it'}"
    if item.state != MediaState.STORED:
        return "could not be read in time (still being fetched)"
    if item.kind in transcribe.AUDIO_KINDS:
        if item.transcript:
            return "transcribed"
        return item.problem or "not transcribed"
    return ""


def parts(items: list[Attachment]) -> list[dict[str, Any]]:
    """OpenAI chat content parts for these files (after the turn's text part). Images
    beyond AGENTLOOP_MEDIA_MAX_TURN_BYTES in all, or too large to decode
    (conversations.media.images), are described instead of shown."""
    found, budget = [], settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES
    for item in items:
        if item.readable and sniff.is_image(item.content_type):
            if (item.size or 0) > budget:
                found.append(_text(describe(item, "not shown: over what one burst may carry")))
                continue
            try:
                url = image_data_url(item.read())
            except images.TooManyPixels as exc:
                found.append(_text(describe(item, f"not shown: {exc}")))
                continue
            budget -= item.size or 0
            found.append({"type": "image_url", "image_url": {"url": url}})
        elif item.transcript:
            found.append(_text(f"{describe(item)}\n{item.transcript}"))
        elif item.readable and item.content_type in ("text/plain", "application/pdf"):
            found.append(_text(f"{describe(item)}\n{document_text(item)}"))
        else:
            found.append(_text(describe(item)))
    return found


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_data_url(data: bytes) -> str:
    """A data URL of the image, re-encoded as JPEG at most AGENTLOOP_MEDIA_IMAGE_MAX_SIDE
    pixels on its longer side when larger (models scale big images down anyway, and
    pay for every byte sent), else as it came. images.TooManyPixels for one too large
    to decode: never sent as it came, where the model's server would decode it."""
    limit = settings.AGENTLOOP_MEDIA_IMAGE_MAX_SIDE
    mime = sniff.content_type(data)
    try:
        with images.opened(data, fit=limit) as image:
            if max(image.size) > limit:
                data, mime = images.as_jpeg(image, limit, quality=85), "image/jpeg"
    except images.TooManyPixels:
        raise
    except (OSError, ValueError):
        pass  # not an image Pillow can read: sent as it came, the model's server decides
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def document_text(item: Attachment) -> str:
    """The text of a plain-text or PDF file, at most DOCUMENT_TEXT_CHARS characters."""
    data = item.read()
    if item.content_type == "text/plain":
        text = data.decode("utf-8", "replace")
    else:
        text = _pdf_text(data)
    if len(text) > DOCUMENT_TEXT_CHARS:
        text = text[:DOCUMENT_TEXT_CHARS] + f"\n[… {len(text) - DOCUMENT_TEXT_CHARS} characters cut]"
    return text


def _pdf_text(data: bytes) -> str:
    import pypdf  # only where a PDF is read

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        return "\n".join(page.extract_text() or "" for page in reader.pages[:50])
    except Exception as exc:  # pypdf raises many kinds for a broken file
        return f"[the PDF's text could not be read: {type(exc).__name__}]"
