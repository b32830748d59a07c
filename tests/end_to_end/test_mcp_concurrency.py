"""32 identical calls of an MCP server's tool at once, from two processes (16 threads
each) on PostgreSQL: the MCP server executes it once (the claim's unique index)."""

import json
import sys
import time

import pytest

from tests.conftest import is_postgres, wait_until
from tests.support.mcp_helpers import TicketDesk, register

pytestmark = pytest.mark.e2e


def test_32_concurrent_identical_calls_from_two_processes_execute_once(processes, make_channel, make_conversation,
                                                                      tmp_path):
    if not is_postgres():
        pytest.skip("runs on PostgreSQL (the PostgreSQL pass: tests/conftest.py ONE_PASS)")
    conversation = make_conversation(make_channel("tg"))
    desk = TicketDesk(processes, tmp_path).start()
    register(desk, "tg")
    start_at = time.time() + 6  # both processes imported and connected by then
    callers = [processes.start("caller", [sys.executable, "-m", "tests.support.mcp_callers", "desk__create_ticket",
                                          json.dumps({"subject": "Same"}), str(conversation.pk), "16",
                                          str(start_at)]) for _ in range(2)]
    for caller in callers:
        caller.popen.wait(90)
    statuses = [s for caller in callers for s in json.loads(caller.output().strip().splitlines()[-1])]
    assert len(statuses) == 32
    assert statuses.count("done") == 1, statuses
    assert set(statuses) <= {"done", "duplicate", "in_progress"}
    wait_until(lambda: desk.executions(), message="the execution")
    assert len(desk.executions()) == 1
