"""What a file is, read from its bytes (`filetype`'s magic numbers), never from its name
or the type a platform declared: a `.jpg` that is a ZIP is a ZIP."""

import filetype

TEXT_TYPES = ("text/plain",)
OCTET_STREAM = "application/octet-stream"


def content_type(data: bytes) -> str:
    """The MIME type the bytes show; text/plain for valid UTF-8 without control
    characters; application/octet-stream when nothing matches."""
    if not data:
        return OCTET_STREAM
    kind = filetype.guess(data[:8192])
    if kind is not None:
        mime: str = kind.mime
        return mime
    return "text/plain" if _looks_like_text(data[:65536]) else OCTET_STREAM


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # A cut in the middle of a character at the end of the head is still text.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return not any(ord(c) < 32 and c not in "\t\n\r\f" for c in text)


def is_image(mime: str) -> bool:
    return mime in ("image/jpeg", "image/png", "image/gif", "image/webp")
