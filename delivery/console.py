"""What the operator console shows of the delivery ledger: a live nudge when sends
are recorded, and the dashboard's figures (replies by ledger state, outcomes)."""

from django.db.models import Count

from agentloop import live
from delivery.models import OutboundMessage, OutboundState


def sends_recorded(outcomes):
    """`outcomes`: (row, SendResult) pairs just written down."""
    if outcomes and live.anyone_listening():
        live.publish([live.DASHBOARD], {
            "kind": "delivery", "delivered": sum(1 for _, result in outcomes if result.ok),
            "failed": sum(1 for _, result in outcomes if not result.ok)})


def replies_by_state():
    """Every ledger row still kept, by state (all states listed, zeros included)."""
    counts = dict(OutboundMessage.objects.values_list("state").annotate(n=Count("pk")).values_list("state", "n"))
    return [{"state": state.value, "label": state.label, "count": counts.get(state.value, 0)}
            for state in OutboundState]


def outcomes_since(since):
    """The last outcome of rows created since then (delivered, flood, temporary…)."""
    return dict(OutboundMessage.objects.filter(created_at__gte=since).exclude(last_outcome="")
                .values_list("last_outcome").annotate(n=Count("pk")).values_list("last_outcome", "n"))


def replies_of(conversation_id, limit=30):
    """The conversation's latest outbound rows, oldest first, with their ledger state."""
    from tools.confirmations import buttons_for_rows

    rows = list(OutboundMessage.objects.filter(conversation_id=conversation_id).order_by("-created_at", "-pk")[:limit])
    # A question still waiting for the user keeps its buttons after a page reload.
    buttons = buttons_for_rows([r.pk for r in rows])
    return [{"kind": "reply", "text": r.text, "at": r.created_at.isoformat(), "state": r.state, "row": r.pk,
             **({"buttons": [{"label": label, "data": data} for label, data in buttons[r.pk]]}
                if r.pk in buttons else {})}
            for r in reversed(rows)]
