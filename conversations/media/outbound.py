"""An agent's files (conversations.agents.File), stored before its reply is written down.

The bytes go to Django's default storage (delivery.attachments.store) outside the turn's
completion transaction — a slow storage must not hold the database — and the reply's
ledger row names them; a crash after storing and before the row leaves only an orphan
object under its digest, which the next write of the same bytes reuses. A file refused
here (empty, over AGENTLOOP_MEDIA_MAX_BYTES, past MAX_FILES) is not sent: the reply says
so in a line of its own, and the log says why once per turn."""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from agentloop.core import languages
from conversations.agents import Answer
from conversations.media import sniff
from conversations.media.download import mb
from delivery.attachments import OutboundFile, store

log = logging.getLogger(__name__)

MAX_FILES = 10  # one reply's files (a Telegram album's most)
NAME_CHARS = 200


def stored_answer(channel_id: int, answer: Answer, language: str = "") -> tuple[str, tuple[OutboundFile, ...]]:
    """The reply's text (with a line for each file refused, in the user's `language`) and
    its stored files. Blocking (storage): called from a thread."""
    stored, refused = [], []
    for index, item in enumerate(answer.files):
        with translation.override(language or languages.default()):
            problem = _problem(item, index)
        if problem:
            refused.append(problem)
            continue
        data = bytes(item.data or b"")  # bytes, and not empty: _problem said so
        stored.append(OutboundFile(file=store(channel_id, data), name=_name(item.name),
                                   type=sniff.content_type(data), size=len(data),
                                   caption=str(item.caption or "")))
    if refused:
        log.warning("turn answer: %d file(s) not attached: %s", len(refused), "; ".join(refused))
    text = "\n".join([answer.text, *(f"({line})" for line in refused)]) if refused else answer.text
    return text.strip("\n"), tuple(stored)


def _problem(item: object, index: int) -> str:
    name = _name(getattr(item, "name", ""))
    data = getattr(item, "data", None)
    if not isinstance(data, bytes | bytearray):
        return _("%(name)s could not be attached: it has no bytes") % {"name": name}
    if index >= MAX_FILES:
        return _("%(name)s was not attached: a reply carries at most %(count)d files") % {"name": name, "count": MAX_FILES}
    if not data:
        return _("%(name)s could not be attached: it is empty") % {"name": name}
    if len(data) > settings.AGENTLOOP_MEDIA_MAX_BYTES:
        return _("%(name)s was not attached: %(size)s is over the %(limit)s a file may have") % {
            "name": name, "size": mb(len(data)), "limit": mb(settings.AGENTLOOP_MEDIA_MAX_BYTES)}
    return ""


def _name(name: object) -> str:
    """A file name safe to show: no path, no control characters, bounded."""
    name = str(name or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable()).strip()
    return name[:NAME_CHARS] or "file"
