"""The retention sweep in a process of its own while a real web server admits 50 messages
a second: nothing the guarantees need is deleted (an open buffer and its message, a ready
turn, a pending ledger row, a claim inside its window), every message is admitted, and
the p99 admission latency during the sweep is measured beside the same without it. The
full size (1 million rows) is the benchmark: tests/bench/retention.py."""

import sys

import pytest

from conversations.models import InboundMessage
from delivery.models import OutboundMessage
from tests.bench import retention
from tests.conftest import is_postgres

pytestmark = pytest.mark.e2e


def test_a_sweep_while_messages_flow_keeps_what_the_guarantees_need(processes, fake_telegram):
    seeded = retention.seed(50_000)
    retention.telegram_channel(fake_telegram.url)
    web = processes.web()
    # One slice with a budget it never reaches: the whole sweep, between 4 s without it before and after.
    flow, seconds, slices, code = retention.measure(web.url, lambda _: processes.start(
        "sweep", [sys.executable, "manage.py", "sweepretention", "--budget", "300"]).popen,
        lambda: retention.left(seeded), slice_seconds=4)
    assert code == 0, processes.started[-1].output()
    assert retention.missing(seeded) == []
    # The rest is gone: the old messages and delivered rows but the kept ones.
    assert InboundMessage.objects.filter(platform_message_id__startswith="old-").count() == 0
    assert list(OutboundMessage.objects.values_list("text", flat=True)) == ["owed"]
    assert set(flow.statuses) == {200} and len(flow.statuses) >= 4 * 50 * 0.9
    assert slices == 1
    line, p99_without, p99_during = retention.summary(flow, seeded.deletable, seconds, slices)
    print(f"[retention, {'postgresql' if is_postgres() else 'sqlite'}] {line}")
    # The 2x target is the benchmark's figure (two shared cores make a hard bound here
    # noisy); a lock held across the sweep would show as seconds.
    assert p99_during < 1000, line
