"""Agent keys issued and revoked: the one way to make a key (`manage.py createagentkey` and
the admin's add form both call `issue`), each on the audit trail. The secret is returned
once to the caller to show; only its SHA-256 is stored (AgentKeyManager.issue)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from audit.events import record
from audit.models import EventKind
from conversations.models import AgentKey

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from conversations.models import Channel


def issue(name: str, channels: Iterable[Channel], *, by: str, key: AgentKey | None = None) -> tuple[AgentKey, str]:
    """A new key named `name` for `channels`; `key`: an unsaved instance to save as it (the
    admin's form's). Returns the key and its secret, which is never available again."""
    listed = list(channels)
    with transaction.atomic():
        key, raw = AgentKey.objects.issue(name, listed, key=key)
        record(EventKind.AGENT_KEY_ISSUED, actor=by, target=f"agent key {key.pk}",
               summary=f"{name} ({key.prefix}…) for {', '.join(c.slug for c in listed) or 'no channel'}",
               channels=[c.slug for c in listed])
    return key, raw


def revoke(keys: QuerySet[AgentKey], *, by: str) -> int:
    """Revoke each live key of `keys` (a queryset); the API refuses it from its next
    request. Returns how many were live."""
    revoked = 0
    with transaction.atomic():
        for key in keys.select_for_update().filter(revoked_at__isnull=True):
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
            record(EventKind.AGENT_KEY_REVOKED, actor=by, target=f"agent key {key.pk}",
                   summary=f"{key.name} ({key.prefix}…)")
            revoked += 1
    return revoked
