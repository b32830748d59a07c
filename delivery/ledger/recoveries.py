"""Stale recoveries: a recovered reply (one resent labelled, its first send's fate
unknown) whose conversation has since had a newer reply delivered. The person has moved
on: resent as it was, it would read as the answer to what they asked last (OpenClaw
#39138: 110 old replies resent after a restart). Its channel decides
(`Channel.stale_recoveries`): sent with the time it was written ("♻️ Recovered reply
from 14:02 — …"), or dropped — abandoned, and audited with the reason.

Decided right after the claim, on the rows won (the claim's own owner and token guard
the drop), so every path that sends a recovered row — the boot sweep, the runtime sweep,
django-q2's safety sweep — decides the same way. Only labelled rows are looked at: a
reply never sent before is not a recovery."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import Max

from delivery.ledger.outcomes import _audit_abandoned
from delivery.ledger.replies import recovery_prefix
from delivery.models import OutboundMessage, OutboundState

DROP = "drop"  # conversations.models.StaleRecoveries.DROP (delivery imports nothing above it)


def label_of(row: OutboundMessage) -> str:
    """The marker a labelled send of `row` starts with: dated when its conversation has
    moved past it (`settle_stale` set `recovered_from`)."""
    written_at = getattr(row, "recovered_from", None)
    return recovery_prefix(row.language, written_at, getattr(row.channel, "time_zone", "") if written_at else "")


def settle_stale(rows: list[OutboundMessage], owner: str) -> list[OutboundMessage]:
    """The claimed `rows` still to send: a stale recovery is dated (`recovered_from`) or,
    where its channel says drop, abandoned here and left out."""
    recovered = [row for row in rows if row.needs_marker]
    if not recovered:
        return rows
    latest = _latest_delivered({row.conversation_id for row in recovered})
    dropped: set[int] = set()
    for row in recovered:
        newer = latest.get(row.conversation_id)
        if newer is None or newer <= row.created_at:
            continue
        if getattr(row.channel, "stale_recoveries", "") == DROP:
            if _drop(row, owner):
                dropped.add(row.pk)
        else:
            row.recovered_from = row.created_at
    return [row for row in rows if row.pk not in dropped]


def _latest_delivered(conversation_ids: Iterable[int]) -> dict[int, datetime]:
    """Per conversation, when its newest delivered reply was written."""
    found = (OutboundMessage.objects.filter(conversation_id__in=list(conversation_ids), state=OutboundState.DELIVERED)
             .values("conversation_id").annotate(newest=Max("created_at")))
    return {item["conversation_id"]: item["newest"] for item in found}


def _drop(row: OutboundMessage, owner: str) -> bool:
    """Abandon a stale recovery this claim holds (its token: nobody else's claim)."""
    with transaction.atomic():
        if not OutboundMessage.transition(row.pk, OutboundState.ATTEMPTING, OutboundState.ABANDONED,
                                          where={"owner": owner, "claim_token": row.claim_token},
                                          next_attempt_at=None):
            return False
        _audit_abandoned(row, "dropped: a newer reply was delivered in the conversation since it was written "
                              "(the channel's stale recoveries: drop)")
    return True
