"""The worker's side of a file: claimed (a compare-and-swap PENDING → FETCHING under a
lease, so two workers never fetch one file), fetched through its platform under a
deadline and the size cap, stored, settled.

A try that fails is retried with backoff (`AGENTLOOP_MEDIA_ATTEMPTS` in all, logged
once per file when it gives up, not once per try); a file its platform refuses for good
(404, over the cap) is settled at once. A lease that outlives its worker (SIGKILL
mid-download) expires and the file is fetched again: nothing was stored under it.

A file that would take its burst over AGENTLOOP_MEDIA_MAX_TURN_BYTES is not fetched at
all (`over_their_bursts`): it is settled SKIPPED when claimed, and the model is told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agentloop.core.redaction import redact
from audit.failpoints import failpoint
from conversations import platforms
from conversations.media import sniff, uploads
from conversations.media.download import FileTooLarge, FileUnavailable, mb
from conversations.models import SETTLED, InboundMessage, MediaFile, MediaState

log = logging.getLogger(__name__)

RETRY_DELAYS = (1.0, 3.0, 9.0)  # before the 2nd, 3rd, 4th try


def lease_seconds() -> float:
    deadline: float = settings.AGENTLOOP_MEDIA_FETCH_DEADLINE
    return deadline + 10.0


def due_ids(limit: int, now: datetime | None = None) -> list[int]:
    now = now or timezone.now()
    return list(MediaFile.objects.filter(state=MediaState.PENDING, next_attempt_at__lte=now)
                .order_by("pk").values_list("pk", flat=True)[:limit])


def due_ids_among(ids: Iterable[int], now: datetime | None = None) -> list[int]:
    """Those of `ids` pending and due now (a turn waiting for them fetches them itself)."""
    return list(MediaFile.objects.filter(pk__in=ids, state=MediaState.PENDING,
                                         next_attempt_at__lte=now or timezone.now()).values_list("pk", flat=True))


def claim(ids: Collection[int], owner: str, now: datetime | None = None) -> list[MediaFile]:
    """The files of `ids` still pending and due (a retry waits out its backoff), now FETCHING under `owner` until its lease
    ends (those another worker claimed first are not returned). Those that would take
    their burst over its cap are settled SKIPPED instead, and not returned."""
    if not ids:
        return []
    now = now or timezone.now()
    until = now + timedelta(seconds=lease_seconds())
    MediaFile.transition(list(ids), MediaState.PENDING, MediaState.FETCHING, where={"next_attempt_at__lte": now},
                         owner=owner, lease_until=until, attempts=F("attempts") + 1)
    won = list(MediaFile.objects.filter(pk__in=ids, state=MediaState.FETCHING, owner=owner, lease_until=until)
               .select_related("channel"))
    over = over_their_bursts([file.pk for file in won])
    if over:
        MediaFile.transition(list(over), MediaState.FETCHING, MediaState.SKIPPED, where={"owner": owner},
                             problem=over_burst_problem(), settled_at=now, lease_until=None)
    return [file for file in won if file.pk not in over]


def over_burst_problem() -> str:
    return f"over what one burst may carry ({mb(settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES)} in all)"


def over_their_bursts(ids: Collection[int]) -> set[int]:
    """Those of `ids` that would take the burst they arrived in (their message's buffer,
    open or flushed into a turn) over AGENTLOOP_MEDIA_MAX_TURN_BYTES — or every burst,
    for a file sent in several.

    The rule, the same whichever worker applies it and whenever: a burst's files are
    taken in order of arrival, each weighing its stored size once stored, else the size
    its platform declared (a file skipped or failed weighs nothing); a file fits if the
    files before it that fit, and itself, stay within the cap. A file's answer depends
    only on the files that arrived before it and on sizes fixed at admission, so two
    workers fetching two files of one burst at once decide alike, and a file arriving
    later never changes an earlier one's. A file whose size its platform does not
    declare (WhatsApp's) weighs nothing until it is stored; what a turn shows stays
    bounded by the same cap (for_agents.parts)."""
    if not ids:
        return set()
    buffers = set(InboundMessage.objects.filter(media_file_id__in=ids, buffer_id__isnull=False)
                  .values_list("buffer_id", flat=True))
    if not buffers:
        return set()
    by_buffer: dict[int, list[tuple[Any, ...]]] = {}
    for buffer_id, *file in (InboundMessage.objects.filter(buffer_id__in=buffers, media_file__isnull=False)
                             .order_by("received_at", "pk")
                             .values_list("buffer_id", "media_file_id", "media_file__state", "media_file__size",
                                          "media_file__declared_size")):
        by_buffer.setdefault(buffer_id, []).append(tuple(file))
    fitting = set().union(*(_fitting(files) for files in by_buffer.values()))
    in_a_burst = {pk for files in by_buffer.values() for pk, *_ in files}
    return {pk for pk in ids if pk in in_a_burst and pk not in fitting}


def _fitting(files: Iterable[tuple[Any, ...]]) -> set[int]:
    """The ids of a burst's (id, state, size, declared size), in arrival order, that fit its cap."""
    cap, total = settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES, 0
    fitting: set[int] = set()
    seen: set[int] = set()
    for pk, state, size, declared in files:
        if pk in seen or state in (MediaState.SKIPPED, MediaState.FAILED):
            continue
        seen.add(pk)
        weight = (size if state == MediaState.STORED else declared) or 0
        if total + weight <= cap:
            total += weight
            fitting.add(pk)
    return fitting


def release_expired(now: datetime | None = None, dead_owners: Collection[str] = ()) -> int:
    """FETCHING files whose lease ran out (their worker hung), or whose worker is known
    dead (conversations.engine.dead_owners: no need to wait out its lease), go back to
    PENDING."""
    now = now or timezone.now()
    lapsed = Q(lease_until__lt=now) | Q(owner__in=list(dead_owners)) if dead_owners else Q(lease_until__lt=now)
    ids = list(MediaFile.objects.filter(lapsed, state=MediaState.FETCHING).values_list("pk", flat=True)[:100])
    return MediaFile.transition(ids, MediaState.FETCHING, MediaState.PENDING, where=lapsed,
                                owner="", lease_until=None) if ids else 0


def states(ids: Iterable[int]) -> dict[int, tuple[str, object]]:
    """{id: (state, next_attempt_at)} of these files."""
    return {pk: (state, at) for pk, state, at in
            MediaFile.objects.filter(pk__in=ids).values_list("pk", "state", "next_attempt_at")}


async def fetch(file: MediaFile) -> bytes:
    """The file's bytes from its platform, within the deadline and the cap (raises
    FileUnavailable / FileTooLarge)."""
    limit, deadline = settings.AGENTLOOP_MEDIA_MAX_BYTES, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE
    try:
        data = await asyncio.wait_for(platforms.of(file.channel).fetch_media(file.channel, file.ref, limit),
                                      deadline)
    except TimeoutError:
        raise FileUnavailable(f"the platform did not give the file within {deadline:g} s") from None
    if len(data) > limit:  # a platform hook that read past the cap
        raise FileTooLarge(len(data), limit)
    return data


def save(file: MediaFile, data: bytes) -> dict[str, Any]:
    """Store the bytes (Django's default storage: the filesystem under var/, or S3) under
    a name of their own digest; the fields that say what was stored."""
    name, digest = uploads.store(file.channel_id, data)
    mime = sniff.content_type(data)
    # problem "": an earlier try's failure no longer says anything about the stored file.
    return {"storage_name": name, "content_type": mime, "size": len(data), "sha256": digest, "problem": ""}


def mark_stored(file: MediaFile, owner: str, stored: dict[str, Any], now: datetime | None = None) -> bool:
    failpoint("media.after_store")
    return MediaFile.transition(file.pk, MediaState.FETCHING, MediaState.STORED, where={"owner": owner},
                                settled_at=now or timezone.now(), lease_until=None, **stored) == 1


def mark_failed(file: MediaFile, owner: str, exc: Exception, now: datetime | None = None) -> str:
    """After a failed try: retried later (PENDING with backoff), or settled — SKIPPED
    (over the cap), FAILED (refused for good, or out of tries). Returns the new state."""
    now = now or timezone.now()
    why = redact(str(exc) or type(exc).__name__)[:300]
    if isinstance(exc, FileTooLarge):
        new = MediaState.SKIPPED
    elif getattr(exc, "permanent", False) or file.attempts >= settings.AGENTLOOP_MEDIA_ATTEMPTS:
        new = MediaState.FAILED
    else:
        delay = RETRY_DELAYS[min(file.attempts, len(RETRY_DELAYS)) - 1]
        moved = MediaFile.transition(file.pk, MediaState.FETCHING, MediaState.PENDING, where={"owner": owner},
                                     owner="", lease_until=None, problem=why,
                                     next_attempt_at=now + timedelta(seconds=delay))
        return MediaState.PENDING if moved else ""
    moved = MediaFile.transition(file.pk, MediaState.FETCHING, new, where={"owner": owner}, problem=why,
                                 settled_at=now, lease_until=None)
    if moved and new == MediaState.FAILED:
        log.warning("file %s (%s) of channel %s could not be fetched after %d tries: %s",
                    file.pk, file.kind, file.channel.slug, file.attempts, why)
    return new if moved else ""


def is_settled(state: str) -> bool:
    return state in SETTLED
