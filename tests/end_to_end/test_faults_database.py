"""The database goes away and comes back, with real processes (daphne, the worker loop)
and the local fake Bot API; tests/faults/outage.py runs each scenario in a child
process set up on the scenario's own database — a throwaway PostgreSQL cluster this
module starts (it is stopped and restarted, so never the suite's server), whichever
database the suite itself runs on; a fresh SQLite file for the lock."""

import pytest

from tests.faults import outage

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    cluster = outage.Cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def logs_in_tmp_path(tmp_path, monkeypatch):
    """A scenario's process logs go under this test's tmp_path (its child inherits this
    environment), not into /tmp for good."""
    monkeypatch.setenv(outage.LOGS, str(tmp_path))


def assert_nothing_lost_or_doubled(figures):
    assert figures["all_answered"], figures
    assert figures["missing"] == 0, figures
    assert figures["unlabelled_duplicates"] == 0, figures


def assert_next_message_answered_in_time(figures):
    """Answered within its window + 2 s of the database's return (or of being sent)."""
    assert figures["after_outage_answered"], figures
    assert figures["after_outage_beyond_window"] <= 2.0, figures


def test_postgres_restarted_mid_traffic(cluster):
    """`pg_ctl restart -m fast` while 30 chats write: each answered once, the next message
    on time, and the worker's log quiet while the database is away."""
    figures = outage.run_on_cluster(cluster, ["restart"], restart={"chats": 24, "over": 6.0, "down_at": 2.5,
                                                                   "down_for": 0.0})["restart"]
    assert_nothing_lost_or_doubled(figures)
    assert_next_message_answered_in_time(figures)
    assert figures["first_flush_after_return"] is not None and figures["first_flush_after_return"] <= 2.0, figures
    # A restart is over in a fraction of a second, too short for a rate: a handful of lines
    # (a fault's first line per kind, the liveness lock let go and taken again, "back after"),
    # never one per try (the worker retries every 20 ms or so).
    assert figures["worker_log_lines_during_outage"] <= 10, "\n".join(figures["worker_log_during_outage"])


def test_postgres_down_for_seconds_mid_traffic(cluster):
    figures = outage.run_on_cluster(cluster, ["restart"], restart={"chats": 20, "over": 6.0, "down_at": 2.0,
                                                                   "down_for": 3.0})["restart"]
    assert_nothing_lost_or_doubled(figures)
    assert_next_message_answered_in_time(figures)
    assert figures["worker_log_lines_per_second"] < 20, "\n".join(figures["worker_log_during_outage"])


def test_postgres_backends_terminated_mid_traffic(cluster):
    figures = outage.run_on_cluster(cluster, ["terminate"], terminate={"chats": 16, "over": 4.0, "kill_at": 1.5}
                                    )["terminate"]
    assert sum(figures["backends_killed"]) > 0, figures
    assert_nothing_lost_or_doubled(figures)
    assert_next_message_answered_in_time(figures)
    assert figures["worker_log_lines"] < 40, figures


def test_a_turn_running_while_postgres_is_away_answers_once(cluster):
    """A 3 s agent; the database away 4.5 s from just after the turn started: the reply
    waits in memory, is written down when the database is back, and goes out once; the
    conversation's next message is answered."""
    figures = outage.run_on_cluster(cluster, ["slow-turn"], slow_turn={"agent_delay": 3.0, "down_for": 4.5}
                                    )["slow-turn"]
    assert figures["answered"] and figures["reply_count"] == 1, figures
    assert figures["next_message_answered"] and figures["follow_up_count"] == 1, figures
    assert figures["missing"] == 0 and figures["unlabelled_duplicates"] == 0, figures
    assert figures["worker_log_lines_per_second"] < 20, figures


def test_sqlite_locked_past_its_timeout():
    """Another connection holds SQLite's write lock (BEGIN IMMEDIATE) for 3 s, with
    SQLITE_TIMEOUT=1: the worker backs off quietly and catches up once it is let go."""
    with outage.sqlite_url() as url:
        figures = outage.run_scenarios(url, ["sqlite-lock"], sqlite_lock={"hold": 3.0})["sqlite-lock"]
    assert_nothing_lost_or_doubled(figures)
    assert_next_message_answered_in_time(figures)
    assert figures["worker_log_lines_per_second"] < 20, "\n".join(figures["worker_log_during_outage"])
