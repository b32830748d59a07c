"""The paced comparison with the peer (issue 57, tests/bench/paced_peer.py): its ladder of
rates, the rate a system kept whole, and the targets it records from the steps."""

import json

import pytest

from tests.bench import paced_peer, targets


def steps(*kept_p99):
    """Steps up the ladder: (kept?, reply p99) each."""
    return [{"rate": rate, "kept": kept, "p99": p99} for rate, (kept, p99) in zip(paced_peer.ladder(), kept_p99)]


def test_the_ladder_climbs_by_a_quarter_from_150_to_at_most_2000():
    rates = paced_peer.ladder()
    assert rates[:6] == [150, 188, 234, 293, 366, 458]
    assert rates[-1] <= paced_peer.MAX_RATE < rates[-1] * paced_peer.STEP_UP


def test_the_kept_rate_is_the_last_step_kept_before_the_first_miss():
    assert paced_peer.kept_rate(steps((True, 1.5), (True, 1.6), (False, 3.0), (True, 1.9))) == 188
    assert paced_peer.kept_rate(steps((False, 3.0))) == 0.0


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(targets, "FILE", tmp_path / "targets.jsonl")

    def rows():
        return {row["target"]: row for row in map(json.loads, targets.FILE.read_text().splitlines())}
    return rows


def test_the_targets_compare_with_the_peers_best_kept_rate_and_its_p99_there(recorded):
    peers = [{"name": "memory", "kept": 366, "steps": steps(*[(True, 1.6)] * 5 + [(False, 3.5)])},
             {"name": "redis", "kept": 293, "steps": steps(*[(True, 1.6)] * 4 + [(False, 2.6)])}]
    sqlite = {"database": "SQLite", "window": 1.5, "kept": 572,
              "steps": steps(*[(True, 1.6)] * 4 + [(True, 1.7), (True, 1.9), (True, 2.0), (False, 4.0)])}
    postgres = {"database": "PostgreSQL", "window": 1.5, "kept": 366,
                "steps": steps(*[(True, 1.6)] * 4 + [(True, 2.1), (False, 4.0)])}
    by_database = {"SQLite": sqlite, "PostgreSQL": postgres}
    paced_peer.record(sqlite, peers, by_database)
    paced_peer.record(postgres, peers, by_database)
    rows = recorded()
    assert rows["kept-whole rate >= 1.5x the peer's best"]["ok"]  # 572 / 366 = 1.56
    assert rows["kept-whole rate >= 1.5x the peer's best"]["figure"].startswith("1.56x (572 vs 366/s, memory)")
    assert not rows["kept-whole rate >= 1.2x the peer's best"]["ok"]  # PostgreSQL: 1.00x
    assert not rows["kept-whole rate >= 0.8x SQLite's"]["ok"]  # 366 / 572 = 0.64
    at_peers_rate = [json.loads(line) for line in targets.FILE.read_text().splitlines()
                     if json.loads(line)["target"] == "reply p99 at the peer's kept rate <= the peer's"]
    assert [(row["database"], row["ok"]) for row in at_peers_rate] == [("SQLite", False), ("PostgreSQL", False)]
    assert at_peers_rate[0]["figure"].startswith("1.70 vs 1.60 s at 366/s")
