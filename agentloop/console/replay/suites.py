"""Suites: a folder of recordings with expectations, replayed one after the other for a
team's CI (`manage.py replay --suite DIR`).

Each recording `NAME.json` is checked against `NAME.expect.json` beside it, else the
folder's `expectations.json`. An expectations file is a JSON object: `configuration`
(what to replay with: agent, agent_config, tools, settings — as `manage.py replay`
takes them) and `expect`, a small declared assertion each:

    turns: N                       exactly N turns
    turns_at_most: N               at most N turns
    executed: N                    N guarded tool calls carried out
    duplicates_prevented: N        N calls the guard caught as duplicates
    no_duplicate_prevented: true   none caught (the agent never asked twice)
    no_tool_called_twice: true     no (tool, arguments) asked for twice, caught or not
    no_tool_executed_twice: true   no (tool, arguments) carried out twice
    at_most_one_turn_per_burst: MS messages less than MS apart (true: 5000) answered in one turn
    reply_mentions: TEXT           some reply says TEXT (case aside)
    same_merges_as_recorded: true  the bursts merged as they were recorded
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.console.replay import comparison, document
from agentloop.console.replay.document import Document, RecordingError

EXPECTATIONS = "expectations.json"
SUFFIX = ".expect.json"
BURST_GAP_MS = 5000  # "nobody recommends more than ~5 s" (the seeds): messages closer than this are one burst

Check = Callable[[Document, Document, Any], str]  # (recording, replay result, argument) -> why it failed, or ""


def _count(name: str, expected: Any, got: int) -> str:
    return "" if got == expected else f"expected {name} = {expected}, got {got}"


def _calls(result: Document, guard: str | None = None) -> list[str]:
    return [json.dumps([c.get("tool"), c.get("arguments")], sort_keys=True)
            for turn in result["happened"]["turns"] for c in turn.get("tools") or ()
            if guard is None or c.get("guard") == guard]


def _twice(calls: list[str], what: str) -> str:
    repeated = [call for call, n in Counter(calls).items() if n > 1]
    return f"{what} twice: {', '.join(repeated)}" if repeated else ""


def _bursts(recorded: Document, gap_ms: int) -> list[set[str]]:
    bursts: list[set[str]] = []
    last = None
    for event in recorded["events"]:
        if event["type"] != "message":
            continue
        if last is None or event["at_ms"] - last >= gap_ms:
            bursts.append(set())
        bursts[-1].add(event["id"])
        last = event["at_ms"]
    return bursts


def _one_turn_per_burst(recorded: Document, result: Document, gap: Any) -> str:
    gap_ms = BURST_GAP_MS if gap is True else int(gap)
    turns = [set(turn.get("messages") or ()) for turn in result["happened"]["turns"]]
    split = [sorted(burst) for burst in _bursts(recorded, gap_ms) if sum(bool(burst & turn) for turn in turns) > 1]
    return f"a burst answered in more than one turn: {split}" if split else ""


def _mentions(_: Document, result: Document, text: Any) -> str:
    replies = [reply.get("text", "") for reply in result["happened"]["replies"]]
    return "" if any(str(text).lower() in reply.lower() for reply in replies) else f"no reply mentions {text!r}"


def _totals(result: Document) -> dict[str, Any]:
    return comparison.totals(result["happened"])


CHECKS: dict[str, Check] = {
    "turns": lambda _, r, n: _count("turns", n, _totals(r)["turns"]),
    "turns_at_most": lambda _, r, n: "" if _totals(r)["turns"] <= n else f"expected at most {n} turns, got {_totals(r)['turns']}",
    "executed": lambda _, r, n: _count("executed", n, _totals(r)["executed"]),
    "duplicates_prevented": lambda _, r, n: _count("duplicates_prevented", n, _totals(r)["duplicates_prevented"]),
    "no_duplicate_prevented": lambda _, r, on: _count("duplicates_prevented", 0, _totals(r)["duplicates_prevented"])
    if on else "",
    "no_tool_called_twice": lambda _, r, on: _twice(_calls(r), "called") if on else "",
    "no_tool_executed_twice": lambda _, r, on: _twice(_calls(r, "executed"), "executed") if on else "",
    "at_most_one_turn_per_burst": lambda rec, r, gap: _one_turn_per_burst(rec, r, gap) if gap else "",
    "reply_mentions": _mentions,
    "same_merges_as_recorded": lambda rec, r, on: "" if not on or comparison.merges(rec["happened"]) == comparison.merges(
        r["happened"]) else f"merged {comparison.merges(r['happened'])}, recorded {comparison.merges(rec['happened'])}",
}


def failures(recorded: Document, result: Document, expect: dict[str, Any]) -> list[str]:
    return [f"{name}: {why}" for name, argument in expect.items() if (why := CHECKS[name](recorded, result, argument))]


@dataclass(frozen=True)
class Case:
    """One recording of a suite and what it is expected to do."""

    recording: Path
    configuration: dict[str, Any]
    expect: dict[str, Any]


def read_expectations(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(configuration, expect) of an expectations file; RecordingError says what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordingError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("expect"), dict) or not data["expect"]:
        raise RecordingError(f"{path}: needs an \"expect\" object with at least one expectation")
    unknown = sorted(set(data["expect"]) - set(CHECKS))
    if unknown:
        raise RecordingError(f"{path}: unknown expectation(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    configuration = data.get("configuration") or {}
    if not isinstance(configuration, dict):
        raise RecordingError(f"{path}: \"configuration\" must be an object")
    return configuration, data["expect"]


def cases(folder: Path) -> Iterator[Case]:
    """The folder's recordings in name order, each with its expectations."""
    if not folder.is_dir():
        raise RecordingError(f"{folder}: not a folder")
    shared = folder / EXPECTATIONS
    recordings = sorted(p for p in folder.glob("*.json") if p.name != EXPECTATIONS and not p.name.endswith(SUFFIX))
    if not recordings:
        raise RecordingError(f"{folder}: no recording (*.json) in it")
    for path in recordings:
        own = path.with_name(path.name[:-len(".json")] + SUFFIX)
        source = own if own.exists() else shared
        if not source.exists():
            raise RecordingError(f"{path}: no expectations ({own.name} or {EXPECTATIONS})")
        configuration, expect = read_expectations(source)
        yield Case(path, configuration, expect)


def load(case: Case) -> Document:
    return document.read(case.recording)
