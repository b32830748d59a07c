"""`make bench` ends with every target it measured, met or not (tests/bench/targets.py).
The benchmarks themselves are never run by `make test`; here are their verdicts on made-up
figures of the shape they measure, so a key or a comparison that is wrong shows here, not
at the end of a 40-minute run."""

import pytest

from tests.bench import grown, peer, peer_run, sustained, targets


@pytest.fixture(autouse=True)
def own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(targets, "FILE", tmp_path / "targets.jsonl")


def steady(rate, p99, **more):
    return {"rate": rate, "p50": p99 / 3, "p99": p99, "errors": 0, "seconds": 10.0, "replies_rate": rate / 2,
            "owed_at_end": 0, "drained": 1.0, "once": 1000, "missing": 0, "doubled": 0, **more}


def system(name, database, steady_state, kill_answered=peer.KILL_BURST):
    return {"rate": 1800.0, "p50": 5.0, "p99": 40.0, "errors": 0, "once": 2000, "missing": 0, "doubled": 0,
            "steady": steady_state, "kill": {"accepted": peer.KILL_BURST, "before_kill": 0,
                                             "answered": kill_answered, "doubled": 0},
            "name": name, "database": database}


def by_target(rows):
    return {(row["database"], row["target"]): row for row in rows}


def test_the_peer_targets_are_judged_against_the_peers_best():
    best = system("Chat SDK (Redis)", "", steady(700.0, 60.0))
    peer_run.record_targets(system("agentloop (SQLite)", "SQLite", steady(1000.0, 45.0)), best)
    peer_run.record_targets(system("agentloop (PostgreSQL)", "PostgreSQL", steady(880.0, 70.0, doubled=1),
                               kill_answered=19), best)
    rows = by_target(targets.recorded())
    assert rows["SQLite", "steady accepted POSTs/s >= 1.3x the peer's best"]["ok"]  # 1.43x
    assert rows["SQLite", "steady accepted POSTs/s >= 1.3x the peer's best"]["figure"].startswith("1.43x")
    assert rows["SQLite", "steady POST p99 <= 1.0x the peer's best"]["ok"]
    assert not rows["PostgreSQL", "steady accepted POSTs/s >= 1.3x the peer's best"]["ok"]  # 1.26x
    assert not rows["PostgreSQL", "steady POST p99 <= 1.0x the peer's best"]["ok"]
    assert not rows["PostgreSQL", "every message answered exactly once"]["ok"]
    assert not rows["PostgreSQL", "20/20 answered once after a SIGKILL mid-burst"]["ok"]
    assert [row["ok"] for row in targets.recorded()] == [True] * 4 + [False] * 4


def test_the_summary_counts_and_marks_what_was_missed():
    targets.record("peer", "SQLite", "steady POST p99 <= 1.0x", True, "0.70x")
    targets.record("sustained", "SQLite", "reply latency p99 <= 10 % apart", False, "10.4%")
    first, *lines = targets.summary(targets.recorded())
    assert first == "targets of this run (SQLite): 1 of 2 met, 1 NOT MET"
    assert lines[0].split()[:2] == ["met", "peer"] and lines[1].split()[:2] == ["NOT", "MET"]
    assert "10.4%" in lines[1]
    targets.reset()
    assert targets.summary(targets.recorded())[0].startswith("no target recorded")


def test_a_sustained_run_records_flatness_once_and_memory(monkeypatch):
    rate, bucket, seconds = 10.0, 60.0, 120.0
    lead = int(sustained.LEAD_IN * rate)
    n = lead + int(seconds * rate)
    # The last minute's replies 20 % later than the first's: p50 and p99 not flat.
    latency = {i: 4.0 if i < lead + bucket * rate else 4.8 for i in range(n)}
    bucket_figures = {"due": 600, "accepted": 600, "p50_ms": 3.0, "p99_ms": 9.0, "lag_max_ms": 2.0}
    run = {"n": n, "errors": 0, "per_client": [n], "per_bucket": [bucket_figures, bucket_figures],
           "lead_in": {**bucket_figures, "due": lead, "accepted": lead},
           "paced": {"rate": rate, "returning_after": 300, "lead_in": sustained.LEAD_IN}}
    mb = 1024
    memory = [{"web": 100 * mb, "worker": 90 * mb}, {"web": 101 * mb, "worker": 95 * mb},
              {"web": 101 * mb, "worker": 120 * mb}]
    lines = []
    sustained.report_system(lambda tag, text: lines.append(text), "agentloop (SQLite)", {
        "steady": {"rate": 20.0, "seconds": 10.0, "drained": 1.0, "once": 220}, "peak": 12.5,
        "steps": [(12.5, 0.5, 0.0, True)], "rate": rate, "seconds": seconds, "bucket": bucket, "run": run,
        "latency": latency, "missing": 0, "doubled": 0, "memory": memory, "database": "SQLite"})
    rows = by_target(targets.recorded())
    assert rows["SQLite", "accepted rate: first and last 60 s <= 10% apart"]["ok"]
    assert not rows["SQLite", "reply latency p50: first and last 60 s <= 10% apart"]["ok"]
    assert rows["SQLite", "reply latency p99: first and last 60 s <= 10% apart"]["figure"].startswith("20.0%")
    assert rows["SQLite", "every message answered exactly once"]["ok"]
    memory_row = rows["SQLite", "no process growing 10 MB or more in the second half"]
    assert not memory_row["ok"] and "growing: worker" in memory_row["figure"]
    assert any("lead-in" in text and "not judged" in text for text in lines)


class Kit:
    """What grown.report reads of the runner (tests.bench.__main__)."""

    import os

    def __init__(self):
        self.lines = []

    def report(self, tag, text):
        self.lines.append(text)


def test_the_grown_targets_are_recorded_per_database(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/agentloop")
    runs = {"empty": [{"p99": 1.0, "lost": 0, "double": 0}], "grown": [{"p99": 1.3, "lost": 0, "double": 0}]}
    pages = [grown.grown_pages.Page("story page", 300, grown_ms=120.0, empty_ms=20.0, note=""),
             grown.grown_pages.Page("dashboard snapshot", 200, grown_ms=230.0, empty_ms=50.0, note="")]

    class Databases:
        note = "the grown database copied"

    grown.report(Kit(), runs, {"empty": [1000.0], "grown": [950.0]}, pages, Databases())
    rows = by_target(targets.recorded())
    assert rows["PostgreSQL", "ingest on the grown database >= 0.9x the empty one's"]["ok"]
    assert not rows["PostgreSQL", "flush lateness p99 on the grown database <= 1.2x the empty one's"]["ok"]
    page_row = next(row for (db, target), row in rows.items() if target.startswith("every page"))
    assert not page_row["ok"] and "over: dashboard snapshot" in page_row["figure"]
