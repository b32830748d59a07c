"""The dashboard's picture of the three layers, put together from each app's own
console functions (no app's tables are read here)."""

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.functional import Promise

from agentloop.core.redaction import redact_payload
from audit import console as audit_console
from audit.models import EventKind
from conversations import console as conversations_console
from delivery import console as delivery_console
from tools import console as tools_console
from tools import registry

# Guard telemetry, over the last TELEMETRY_DAYS: a tool catching more than HIGH_PER_100
# duplicates per 100 turns (over MIN_TURNS turns at least) is flagged (the agent keeps repeating itself: look at the
# prompt or the model); a guarded tool called QUIET_AFTER times without ever catching
# one is flagged too (is the fingerprint too narrow — a field that always differs?).
TELEMETRY_DAYS = 7
HIGH_PER_100 = 5.0
MIN_TURNS = 20  # fewer turns than this say nothing about a rate
QUIET_AFTER = 20
# The telemetry's window shrinks to the latest this many claims when a week holds more:
# its counts (turns, claims and duplicates per tool) stay bounded, and stay ratios of
# the same window (issue 30: a week of 500,000 claims was most of a 2.7 s snapshot).
TELEMETRY_CLAIMS = 10_000
CHART_DAYS = 14
# The 24-hour charts (flush reasons, delivery outcomes) shrink to the latest this many
# turns or ledger rows when a day holds more: a busy day's 150,000 rows were most of the
# grown database's snapshot on PostgreSQL (issue 30). Their shares are what the charts show.
CHART_ROWS = 10_000


def snapshot(now: datetime | None = None) -> dict[str, Any]:
    """The whole picture, redacted like every live event (texts, a proposal's arguments),
    as plain JSON: a choice's label is a lazy text, written here in the active language."""
    picture: dict[str, Any] = redact_payload(_plain(_picture(now or timezone.now())))
    return picture


def _plain(value: Any) -> Any:
    if isinstance(value, Promise):
        return str(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _picture(now: datetime) -> dict[str, Any]:
    day = now - timedelta(hours=24)
    turns_since = conversations_console.turns_window(day, CHART_ROWS)
    replies_since = delivery_console.replies_window(day, CHART_ROWS)
    return {
        "now": now.isoformat(),
        "buffers": conversations_console.open_buffers(),
        "turns": conversations_console.turns_in_flight(),
        # Conversations the loop breaker paused, waiting for an operator (docs/people-in-control.md).
        "paused": conversations_console.paused_by_loops(),
        "proposals": tools_console.pending_proposals(),
        "ledger": delivery_console.replies_by_state(),
        "backlog": delivery_console.backlog(),
        "duplicates": audit_console.recent(limit=10, kinds=[EventKind.DUPLICATE_PREVENTED]),
        "events": audit_console.recent(limit=15),
        "charts": {
            "duplicates_per_day": _days(audit_console.duplicates_by_day(now - timedelta(days=CHART_DAYS - 1)), now),
            "duplicates_per_tool": audit_console.duplicates_by_tool(now - timedelta(days=CHART_DAYS)),
            "flush_reasons": conversations_console.flush_reasons(turns_since),
            "delivery_outcomes": delivery_console.outcomes_since(replies_since),
            # When each 24-hour chart starts: later than 24 hours ago when it was shrunk.
            "since": {"flush_reasons": turns_since.isoformat(), "delivery_outcomes": replies_since.isoformat(),
                      "day": day.isoformat(), "latest": CHART_ROWS},
        },
        "telemetry": guard_telemetry(now),
        # The audit kinds' names in the reader's language (the snapshot is built in it; a
        # live event's label is in its publisher's).
        "labels": {"event": {kind: str(label) for kind, label in EventKind.choices}},
    }


def _days(counts: dict[str, int], now: datetime) -> dict[str, int]:
    """Every day of the chart, zeros included, oldest first."""
    days = [(now - timedelta(days=n)).date().isoformat() for n in range(CHART_DAYS - 1, -1, -1)]
    return {d: counts.get(d, 0) for d in days}


def guard_telemetry(now: datetime | None = None) -> list[dict[str, Any]]:
    now = now or timezone.now()
    since = tools_console.window_of_latest(now - timedelta(days=TELEMETRY_DAYS), TELEMETRY_CLAIMS)
    turns = conversations_console.turn_count(since)
    duplicates = audit_console.duplicates_by_tool(since)
    claims = tools_console.claims_by_tool(since)
    guarded = {name for name, tool in registry.all_tools().items() if tool.guarded}
    rows = []
    for tool in sorted(guarded | set(duplicates) | set(claims)):
        caught = duplicates.get(tool, 0)
        per_100 = round(100.0 * caught / turns, 1) if turns else 0.0
        flag = ""
        if caught and turns >= MIN_TURNS and per_100 > HIGH_PER_100:
            flag = "high"
        elif tool in guarded and claims.get(tool, 0) >= QUIET_AFTER and not caught:
            flag = "never fires"
        rows.append({"tool": tool, "duplicates": caught, "claims": claims.get(tool, 0), "turns": turns,
                     "per_100_turns": per_100, "flag": flag})
    return rows
