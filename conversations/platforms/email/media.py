"""An attachment fetched again from the mailbox: its ref names the mailbox's UIDVALIDITY,
the mail's UID and the part's number (parsing.attachments). A new connection of its
own (the session's is busy idling), read-only, under one overall deadline; the mail
fetched with BODY.PEEK[] (nothing marked seen) and the part's bytes capped."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from conversations.media.download import FileTooLarge, FileUnavailable
from conversations.platforms.email import parsing
from conversations.platforms.email.mailbox import DEADLINE, connect

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel


async def fetch_media(channel: Channel, ref: str, limit: int) -> bytes:
    try:
        validity, uid, number = (int(piece) for piece in ref.split(":"))
    except ValueError:
        raise FileUnavailable(f"not an attachment of this mailbox: {ref!r}", permanent=True) from None
    try:
        async with asyncio.timeout(DEADLINE * 2):  # (not wait_for: it can drop a cancellation on 3.11)
            return await asyncio.to_thread(_fetch, channel, validity, uid, number, limit)
    except (TimeoutError, OSError) as exc:
        raise FileUnavailable(f"the mailbox could not be read: {type(exc).__name__}") from None


def _fetch(channel: Channel, validity: int, uid: int, number: int, limit: int) -> bytes:
    client = connect(channel)
    try:
        selected = client.select_folder(str(channel.setting("mailbox") or "INBOX"), readonly=True)
        if int(selected[b"UIDVALIDITY"]) != validity:
            raise FileUnavailable("the mailbox was rebuilt (a new UIDVALIDITY): the mail is no longer named so",
                                  permanent=True)
        found = client.fetch([uid], ["RFC822.SIZE", "BODY.PEEK[]"]).get(uid)
        if not found:
            raise FileUnavailable(f"mail UID {uid} is no longer in the mailbox", permanent=True)
        parts = parsing.parts(parsing.read(bytes(found[b"BODY[]"])))
        if number >= len(parts):
            raise FileUnavailable(f"mail UID {uid} has no attachment {number}", permanent=True)
        data = parts[number].get_payload(decode=True)
        if not isinstance(data, bytes):
            raise FileUnavailable(f"attachment {number} of mail UID {uid} has no content", permanent=True)
        if len(data) > limit:
            raise FileTooLarge(len(data), limit)
        return data
    finally:
        try:
            client.logout()
        except Exception:  # noqa: BLE001 -- read already, or failed already
            client.shutdown()
