"""The recorded and the replayed runs side by side: how the bursts merged (which
messages went into which turn), the flush reasons, the tools called and what the guard
made of each, the replies, and the totals — turns, tool calls, duplicates prevented,
tokens, latency. One JSON document; the admin's report renders the same."""

from __future__ import annotations

from typing import Any

from agentloop.console.replay.document import Document

Happened = dict[str, Any]  # a recording's "happened", or a replay's


def totals(happened: Happened) -> dict[str, Any]:
    turns = happened.get("turns") or []
    calls = [call for turn in turns for call in turn.get("tools") or ()]
    latencies = [turn["latency_ms"] for turn in turns if turn.get("latency_ms") is not None]
    return {"turns": len(turns), "tool_calls": len(calls),
            "executed": sum(call.get("guard") == "executed" for call in calls),
            "duplicates_prevented": sum(call.get("guard") == "duplicate_prevented" for call in calls),
            "replies": len(happened.get("replies") or []),
            "tokens": sum(int(turn.get("tokens") or 0) for turn in turns),
            "latency_ms": sum(latencies)}


def merges(happened: Happened) -> list[list[str]]:
    """Which messages each turn merged, turn by turn."""
    return [list(turn.get("messages") or []) for turn in happened.get("turns") or []]


def _turn_view(turn: dict[str, Any] | None) -> dict[str, Any] | None:
    if turn is None:
        return None
    return {"messages": list(turn.get("messages") or []), "flush_reason": turn.get("flush_reason", ""),
            "input": turn.get("input", ""), "state": turn.get("state", ""), "reply": turn.get("reply", ""),
            "tools": [{"tool": c.get("tool", ""), "arguments": c.get("arguments", {}), "guard": c.get("guard", "")}
                      for c in turn.get("tools") or ()],
            "tokens": int(turn.get("tokens") or 0), "latency_ms": turn.get("latency_ms")}


def _differences(recorded: dict[str, Any] | None, replayed: dict[str, Any] | None) -> list[str]:
    if recorded is None or replayed is None:
        return ["turn"]
    differ = [aspect for aspect in ("messages", "flush_reason", "reply") if recorded[aspect] != replayed[aspect]]
    if [(c["tool"], c["guard"]) for c in recorded["tools"]] != [(c["tool"], c["guard"]) for c in replayed["tools"]]:
        differ.append("tools")
    return differ


def compare(recorded: Happened, replayed: Happened) -> Document:
    """Turn by turn (paired by their order), the totals, and whether they are the same."""
    before, after = recorded.get("turns") or [], replayed.get("turns") or []
    turns = []
    for index in range(max(len(before), len(after))):
        left = _turn_view(before[index] if index < len(before) else None)
        right = _turn_view(after[index] if index < len(after) else None)
        turns.append({"index": index, "recorded": left, "replayed": right, "differences": _differences(left, right)})
    same_merges = merges(recorded) == merges(replayed)
    return {"same": not any(t["differences"] for t in turns), "same_merges": same_merges,
            "merges": {"recorded": merges(recorded), "replayed": merges(replayed)},
            "totals": {"recorded": totals(recorded), "replayed": totals(replayed)}, "turns": turns}


def report(recorded: Document, result: Document) -> Document:
    """What `manage.py replay --json` writes and the admin shows: the recording's identity,
    the configuration replayed, the comparison, what the sandbox was sent, what was skipped."""
    conversation = recorded.get("conversation") or {}
    return {"recording": {"conversation": conversation.get("id"), "channel": conversation.get("channel", ""),
                          "kind": conversation.get("kind", ""), "masked": bool(recorded.get("masked")),
                          "events": len(recorded.get("events") or [])},
            "configuration": result["configuration"], "virtual_ms": result["virtual_ms"],
            "wall_ms": result["wall_ms"], "comparison": compare(recorded["happened"], result["happened"]),
            "sent": result["sent"], "skipped": result["skipped"]}
