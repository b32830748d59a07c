"""An agent's files (conversations.agents.File), stored before its reply is written down.

The bytes go to Django's default storage (delivery.attachments.store) outside the turn's
completion transaction — a slow storage must not hold the database — and the reply's
ledger row names them; a crash after storing and before the row leaves only an orphan
object under its digest, which the next write of the same bytes reuses. A file refused
here (empty, over AGENTLOOP_MEDIA_MAX_BYTES, past MAX_FILES) is not sent: the reply says
so in a line of its own, and the log says why once per turn."""

import logging

from django.conf import settings

from conversations.agents import Answer
from conversations.media import sniff
from conversations.media.download import mb
from delivery.attachments import OutboundFile, store

log = logging.getLogger(__name__)

MAX_FILES = 10  # one reply's files (a Telegram album's most)
NAME_CHARS = 200


def stored_answer(channel_id: int, answer: Answer) -> tuple[str, tuple[OutboundFile, ...]]:
    """The reply's text (with a line for each file refused) and its stored files.
    Blocking (storage): called from a thread."""
    stored, refused = [], []
    for index, item in enumerate(answer.files):
        problem = _problem(item, index)
        if problem:
            refused.append(problem)
            continue
        data = bytes(item.data)
        stored.append(OutboundFile(file=store(channel_id, data), name=_name(item.name),
                                   type=sniff.content_type(data), size=len(data),
                                   caption=str(item.caption or "")))
    if refused:
        log.warning("turn answer: %d file(s) not attached: %s", len(refused), "; ".join(refused))
    text = "\n".join([answer.text, *(f"({line})" for line in refused)]) if refused else answer.text
    return text.strip("\n"), tuple(stored)


def _problem(item, index) -> str:
    name = _name(getattr(item, "name", ""))
    data = getattr(item, "data", None)
    if not isinstance(data, bytes | bytearray):
        return f"{name} could not be attached: it has no bytes"
    if index >= MAX_FILES:
        return f"{name} was not attached: a reply carries at most {MAX_FILES} files"
    if not data:
        return f"{name} could not be attached: it is empty"
    if len(data) > settings.AGENTLOOP_MEDIA_MAX_BYTES:
        return f"{name} was not attached: {mb(len(data))} is over the {mb(settings.AGENTLOOP_MEDIA_MAX_BYTES)} a file may have"
    return ""


def _name(name) -> str:
    """A file name safe to show: no path, no control characters, bounded."""
    name = str(name or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable()).strip()
    return name[:NAME_CHARS] or "file"
