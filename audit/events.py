"""The one way to write the audit trail: call `record` inside the transaction of the change."""

from audit.models import AuditEvent


def record(kind, *, conversation=None, actor="", target="", summary="", **extra):
    return AuditEvent.objects.create(
        kind=kind,
        actor=actor,
        channel_slug=conversation.channel.slug if conversation is not None else "",
        conversation_id=conversation.pk if conversation is not None else None,
        target=str(target),
        summary=summary[:300],
        extra=extra,
    )
