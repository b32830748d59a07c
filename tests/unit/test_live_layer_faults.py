"""Redis gone (issue 59): live updates cost a committing step at most SEND_DEADLINE, then
nothing while sends are paused, and the fault is one log line — not one per update —
with one more when Redis is back (agentloop/core/live.py, LayerFaults).

The channel layer is channels-redis pointed at a real socket on this machine: one that
accepts connections and never answers (a Redis host cut off), then a real redis-server."""

import logging
import socket
import subprocess
import time

import pytest
from channels.layers import channel_layers

from agentloop.core import live
from tests.conftest import wait_until

UPDATE = [(("console.dashboard",), {"kind": "test"})]


@pytest.fixture
def layer_at(settings):
    """Point the channel layer at a Redis URL; a fresh fault state each test."""
    def point(url):
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                               "CONFIG": {"hosts": [url]}}}
        channel_layers.backends.clear()
    live.LAYER = live.LayerFaults()
    yield point
    channel_layers.backends.clear()
    live.LAYER = live.LayerFaults()


@pytest.fixture
def silent_socket():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


def test_a_redis_that_never_answers_costs_one_deadline_then_nothing_and_one_line(layer_at, silent_socket, caplog):
    layer_at(f"redis://127.0.0.1:{silent_socket}/0")
    caplog.set_level(logging.INFO, logger="agentloop.core.live")
    started = time.monotonic()
    live._send(UPDATE)
    first = time.monotonic() - started
    assert live.SEND_DEADLINE <= first < live.SEND_DEADLINE + 1.0, first
    started = time.monotonic()
    for _ in range(50):  # while paused: no connection tried, no line written
        live._send(UPDATE)
    assert time.monotonic() - started < 0.2
    lines = [r.getMessage() for r in caplog.records if r.name == "agentloop.core.live"]
    assert len(lines) == 1 and "live updates (channel layer) fault" in lines[0], lines


def test_live_updates_resume_by_themselves_when_redis_is_back(layer_at, tmp_path, caplog):
    with socket.socket() as probe:  # a free port, then a real Redis on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    layer_at(f"redis://127.0.0.1:{port}/0")
    caplog.set_level(logging.INFO, logger="agentloop.core.live")
    live._send(UPDATE)  # refused: nothing listens yet
    assert live.LAYER.paused()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        def sent_again():
            live._send(UPDATE)
            return not live.LAYER.log.failing
        wait_until(sent_again, timeout=40, message="a live update sent once Redis was back")
    finally:
        redis.terminate()
        redis.wait(timeout=10)
    lines = [r.getMessage() for r in caplog.records if r.name == "agentloop.core.live"]
    assert len(lines) == 2 and "back after" in lines[1], lines
