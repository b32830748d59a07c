"""The admission's side: the MediaFile row of a media message, written in the message's
own transaction (one INSERT … ON CONFLICT DO NOTHING: the fetch itself happens later,
on a worker, so a webhook is answered as soon as the message is stored)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

from agentloop.core.rows import insert
from conversations.media.download import FileTooLarge
from conversations.models import MediaFile, MediaState

if TYPE_CHECKING:
    from conversations.ingest.values import MediaRef
    from conversations.models import Channel


def file_id_for(channel: Channel, ref: MediaRef, now: datetime | None = None) -> int:
    """The id of the channel's row for this platform file, created pending (or skipped
    at once when the platform already says it is over the cap)."""
    now = now or timezone.now()
    row = MediaFile(channel=channel, file_key=ref.key[:200], ref=ref.ref[:2000], kind=ref.kind[:30],
                    declared_type=ref.declared_type[:100], file_name=ref.file_name[:255],
                    declared_size=ref.declared_size, duration=ref.duration, created_at=now, next_attempt_at=now)
    limit = settings.AGENTLOOP_MEDIA_MAX_BYTES
    if ref.declared_size and ref.declared_size > limit:
        row.state, row.problem, row.settled_at = MediaState.SKIPPED, str(FileTooLarge(ref.declared_size, limit)), now
    if insert(row, ("channel_id", "file_key")):
        return row.pk
    found: int = MediaFile.objects.filter(channel=channel, file_key=row.file_key).values_list("pk", flat=True).get()
    return found
