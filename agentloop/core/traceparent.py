"""W3C Trace Context's `traceparent` (version 00), as stored on the rows a message's path
writes (agentloop.core.tracing): `00-<trace id: 32 hex>-<span id: 16 hex>-<flags: 2 hex>`."""

LENGTH = 55


def parse(traceparent: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags), or None when it is absent or malformed (a row written
    while tracing was off, or damaged: its next span then has no parent)."""
    if not traceparent or len(traceparent) != LENGTH or traceparent.count("-") != 3:
        return None
    version, trace_id, span_id, flags = traceparent.split("-")
    if version != "00" or len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2:
        return None
    try:
        ids = int(trace_id, 16), int(span_id, 16), int(flags, 16)
    except ValueError:
        return None
    return ids if ids[0] and ids[1] else None  # all-zero ids are invalid


def format(trace_id: int, span_id: int, flags: int) -> str:  # noqa: A001 (the module's verb)
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
