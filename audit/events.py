"""The one way to write the audit trail: call `record` inside the transaction of the change."""

from audit.models import AuditEvent


def record(kind, *, conversation=None, conversation_id=None, channel_slug="", actor="", target="", summary="",
           **extra):
    """`conversation` (a Conversation) or its id and channel slug when the caller has no row."""
    if conversation is not None:
        conversation_id, channel_slug = conversation.pk, conversation.channel.slug
    return AuditEvent.objects.create(
        kind=kind,
        actor=actor,
        channel_slug=channel_slug or "",
        conversation_id=conversation_id,
        target=str(target),
        summary=summary[:300],
        extra=extra,
    )


def recent(kinds=(), channel_slugs=None, agent_key_id=None, since=None, limit=100):
    """Events for monitoring, newest first; restricted to some channels (and the events
    an agent key caused) when `channel_slugs` is given."""
    from django.db.models import Q

    events = AuditEvent.objects.all()
    if kinds:
        events = events.filter(kind__in=kinds)
    if since is not None:
        events = events.filter(at__gt=since)
    if channel_slugs is not None:
        visible = Q(channel_slug__in=list(channel_slugs))
        if agent_key_id is not None:
            visible |= Q(extra__agent_key=agent_key_id)
        events = events.filter(visible)
    return list(events.order_by("-at", "-pk")[:limit])
