"""The web process freezes its boot heap (agentloop/heap.py), so a full collection walks
only the objects made since: checked in a fresh interpreter, as daphne imports it."""

import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[1]

PROBE = """
import gc, time
import agentloop.asgi
frozen = gc.get_freeze_count()
started = time.perf_counter()
gc.collect()
print(frozen, (time.perf_counter() - started) * 1000)
"""


def test_the_web_process_keeps_its_boot_heap_out_of_full_collections():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agentloop.settings"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    frozen, full_pass_ms = int(out[0]), float(out[1])
    assert frozen > 50_000  # Django, channels, the apps: what a full pass walked before
    # Before: ~100 ms on this machine. A loose bound: what is left is a few thousand objects.
    assert full_pass_ms < 20
