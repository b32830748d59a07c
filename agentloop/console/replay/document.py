"""The recording as a document: a versioned JSON object, checked whole when read, so a
replay never starts on something it would misread halfway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = "agentloop-recording"
VERSION = 1
EVENT_TYPES = ("message", "edit", "delete", "tap")
# The channel's settings a recording keeps and a replay applies to its sandbox channel.
SETTINGS = ("agent", "agent_config", "double_texting", "edits", "window_closed", "window_greeting", "window_open",
            "window_neutral", "window_media", "window_album", "max_wait", "max_messages", "media_at_once",
            "greeting_words", "conjunction_words", "language", "time_zone", "group_replies")

Document = dict[str, Any]  # a recording, as JSON reads it


class RecordingError(ValueError):
    """A document that is not a recording this version can replay: the message says why."""


def read(path: str | Path) -> Document:
    """A recording from a file, checked (RecordingError says what is wrong with it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordingError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse(text, str(path))


def parse(text: str, where: str = "the recording") -> Document:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{where}: not JSON ({exc.msg}, line {exc.lineno})") from None
    check(data, where)
    return data  # type: ignore[no-any-return]  # checked just above


def check(data: object, where: str = "the recording") -> None:
    """Raise RecordingError unless `data` is a recording of this version."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError(f"{where}: not an agentloop recording (its \"format\" must be {FORMAT!r})")
    version = data.get("version")
    if version != VERSION:
        raise RecordingError(f"{where}: recording version {version!r} is not one this agentloop reads "
                             f"(it reads version {VERSION})")
    for key, kind in (("conversation", dict), ("settings", dict), ("events", list), ("happened", dict)):
        if not isinstance(data.get(key), kind):
            raise RecordingError(f"{where}: {key!r} is missing or not a JSON {kind.__name__.replace('dict', 'object')}")
    for index, event in enumerate(data["events"]):
        _check_event(event, f"{where}: event {index + 1}")
    unknown = set(data["settings"]) - set(SETTINGS)
    if unknown:
        raise RecordingError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")


def _check_event(event: object, where: str) -> None:
    if not isinstance(event, dict):
        raise RecordingError(f"{where}: not a JSON object")
    if event.get("type") not in EVENT_TYPES:
        raise RecordingError(f"{where}: type {event.get('type')!r} is none of {', '.join(EVENT_TYPES)}")
    at = event.get("at_ms")
    if not isinstance(at, int) or isinstance(at, bool) or at < 0:
        raise RecordingError(f"{where}: at_ms must be a whole number of milliseconds from the first message, >= 0")
    key = "id" if event["type"] == "message" else "of"
    if not isinstance(event.get(key), str) or not event[key]:
        raise RecordingError(f"{where}: {key!r} must name a message")
    if event["type"] in ("message", "edit") and not isinstance(event.get("text", ""), str):
        raise RecordingError(f"{where}: text must be a string")


def dumps(document: Document) -> str:
    return json.dumps(document, ensure_ascii=False, indent=2, sort_keys=False) + "\n"
