"""The worker's pacing through a fault, with an injected clock: back-off doubling to a
cap, and one log line per fault kind per interval — never one per try."""

import logging

from django.db import InterfaceError, OperationalError

from agentloop.core.backoff import Backoff, FaultLog, IdlePoll, fault_kind


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_success():
    backoff = Backoff(first=0.02, cap=1.0)
    assert [backoff.next() for _ in range(8)] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.02


def test_an_idle_poll_slows_after_half_a_second_of_empty_looks_and_is_quick_again_at_the_first_find():
    pace = IdlePoll(busy=0.05, idle=0.25)
    assert {pace.after(found=False) for _ in range(10)} == {0.05}  # half a second of 50 ms looks
    assert [pace.after(found=False) for _ in range(3)] == [0.25, 0.25, 0.25]
    assert pace.after(found=True) == 0.05  # work again: quick at once
    assert pace.after(found=False) == 0.05


def test_an_idle_poll_is_never_quicker_than_busy():
    assert IdlePoll(busy=0.5, idle=0.25).after(found=False) == 0.5


def test_a_restart_burst_is_a_handful_of_kinds():
    assert fault_kind(OperationalError("terminating connection due to administrator command")) == "connection lost"
    assert fault_kind(InterfaceError("the connection is closed")) == "connection lost"
    assert fault_kind(OperationalError('connection to server at "127.0.0.1" failed: Connection refused')) \
        == "database unreachable"
    assert fault_kind(OperationalError("FATAL:  the database system is shutting down")) == "database unreachable"
    assert fault_kind(OperationalError("database is locked")) == "database locked"
    assert fault_kind(OperationalError("deadlock detected")) == "transaction conflict"


def test_one_line_when_a_fault_starts_one_per_interval_while_it_lasts_one_when_it_ends(caplog):
    clock = Clock()
    faults = FaultLog(logging.getLogger("test.faults"), every=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="test.faults")
    faults.recovered()  # healthy: nothing to say
    for _ in range(1000):  # ten seconds of tries every 10 ms
        faults.failed(InterfaceError("the connection is closed"))
        clock.now += 0.01
    faults.failed(OperationalError("connection refused"))  # a new kind is worth a line
    faults.failed(OperationalError("connection refused"))
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    clock.now += 25.0  # 35 s into the fault: the first kind is due again, the second is not
    faults.failed(InterfaceError("the connection is closed"))
    faults.failed(OperationalError("connection refused"))
    assert len(caplog.records) == 3 and "still failing after 35 s" in caplog.records[-1].getMessage()
    faults.recovered()
    faults.recovered()
    assert len(caplog.records) == 4
    assert caplog.records[-1].levelname == "INFO"
    assert caplog.records[-1].getMessage() == "database back after 35.0 s (1004 failed tries)"
    faults.failed(OperationalError("database is locked"))  # a new fault starts over
    assert len(caplog.records) == 5 and "database fault (database locked)" in caplog.records[-1].getMessage()
