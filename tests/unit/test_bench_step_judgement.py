"""The sustained benchmark finds its peak with paced steps; a step counts as kept only if
no backlog grew during it: the replies' p99 close to the quickest, and the last third's
replies no later than the first third's. A worker that catches up in bigger batches can
keep a short step's growing backlog inside the spread alone (stop 48: a 20 s step kept
625/s on SQLite that the 10-minute run could not), so the trend is judged too. The
benchmark itself is never run by `make test`; this is its judgement, on made-up latencies."""

from tests.bench.sustained import KEPT_SPREAD, KEPT_TREND, judge_step

WINDOW = 4.2  # seconds: the reply latency every message of the workload gets


def test_a_step_whose_replies_all_came_after_the_window_is_kept():
    latency = {i: WINDOW + (i % 10) * 0.01 for i in range(600)}
    spread, trend, kept = judge_step(latency, 600)
    assert kept
    assert spread <= 0.1 and abs(trend) < 0.01


def test_a_step_whose_replies_drift_later_is_not_kept_though_its_spread_is_small():
    drift = (KEPT_TREND * 3) / 600  # the last third ends up more than KEPT_TREND behind the first
    latency = {i: WINDOW + i * drift for i in range(600)}
    spread, trend, kept = judge_step(latency, 600)
    assert spread <= KEPT_SPREAD  # what the old, spread-only judgement kept
    assert trend > KEPT_TREND
    assert not kept


def test_a_step_with_a_long_tail_is_not_kept():
    latency = {i: WINDOW for i in range(600)}
    for i in range(0, 600, 50):  # 2 % of the replies late, spread over the step: no trend
        latency[i] = WINDOW + KEPT_SPREAD + 1
    spread, trend, kept = judge_step(latency, 600)
    assert spread > KEPT_SPREAD and abs(trend) < 0.01
    assert not kept


def test_replies_missing_from_a_step_are_left_out_of_its_thirds_not_counted_as_zero():
    latency = {i: WINDOW for i in range(600) if i % 7}
    spread, trend, kept = judge_step(latency, 600)
    assert (spread, trend, kept) == (0.0, 0.0, True)
