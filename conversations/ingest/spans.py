"""Admission spans (agentloop.core.tracing): one per message admitted, the root of its
trace. Its traceparent is stored with the message (Inbound.traceparent), and the flush
that merges the message into a turn — in a worker, later — links to it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from agentloop.core import tracing

if TYPE_CHECKING:
    from agentloop.core.tracing_export import Span
    from conversations.ingest.values import Admission, Inbound
    from conversations.models import Channel

NAME = "agentloop.admit"


def start(channel: Channel, inbound: Inbound,
          batch_size: int | None = None) -> tuple[Span | tracing.NoSpan, Inbound]:
    """(the span, the inbound carrying its traceparent); NO_SPAN and the inbound as it
    was while tracing is off."""
    span = tracing.span(NAME, kind="server", attributes={
        "agentloop.channel.id": channel.pk, "agentloop.channel.kind": channel.kind,
        "agentloop.batch.size": batch_size})
    if span.traceparent is None:
        return span, inbound
    return span, dataclasses.replace(inbound, traceparent=span.traceparent)


def end(span: Span | tracing.NoSpan, result: Admission | BaseException) -> None:
    """`result`: the Admission, or the exception the message got."""
    if isinstance(result, BaseException):
        span.fail(result)
    else:
        span.set({"agentloop.message.id": result.message_id, "agentloop.conversation.id": result.conversation_id,
                  "agentloop.buffer.id": result.buffer_id, "agentloop.admission.duplicate": result.duplicate,
                  "agentloop.admission.disposition": result.disposition or None})
    span.end()
