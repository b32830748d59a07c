"""The tests' zygote (tests/support/zygote.py): a forked child is what `python <args>` would be —
its arguments, environment, working directory, streams and exit status — and nothing a
test sets is read before the child has it."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import BASE_DIR
from tests.support.zygote import Zygote

PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "marker": os.environ.get("MARKER"),
                  "settings": os.environ.get("DJANGO_SETTINGS_MODULE"), "name": __name__,
                  "prometheus": "prometheus_client" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """One zygote for the module's tests: its start preloads what the product's processes
    import, 2.5 s of CPU, and a child is independent of its siblings (a test says so)."""
    zygote = Zygote(BASE_DIR, tmp_path_factory.mktemp("zygote") / "zygote.log")
    yield zygote
    zygote.stop()


def spawn(zygote, tmp_path, args, **env):
    log = tmp_path / f"child-{time.monotonic_ns()}.log"
    log.touch()
    return zygote.spawn([sys.executable, *args], {"PATH": "/usr/bin:/bin", **env}, tmp_path, log), log


def test_a_script_runs_as_main_with_its_arguments_environment_streams_and_exit_status(zygote, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    child, log = spawn(zygote, tmp_path, [str(script), "one", "two"], MARKER="m-1", EXIT="3",
                       DJANGO_SETTINGS_MODULE="agentloop.settings")
    assert child.wait(30) == 3 and child.poll() == 3
    seen, stderr = log.read_text().splitlines()
    assert json.loads(seen) == {"argv": [str(script), "one", "two"], "cwd": str(tmp_path), "path0": str(tmp_path),
                                "marker": "m-1", "settings": "agentloop.settings", "name": "__main__",
                                "prometheus": False}
    assert stderr == "to stderr"


def test_a_module_runs_with_python_dash_m(zygote, tmp_path):
    (tmp_path / "data.json").write_text('{"b": 1, "a": [2]}')
    child, log = spawn(zygote, tmp_path, ["-m", "json.tool", "--sort-keys", "data.json"])
    assert child.wait(30) == 0
    assert json.loads(log.read_text()) == {"a": [2], "b": 1}


def test_a_killed_child_reports_the_signal_as_popen_does(zygote, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    child, log = spawn(zygote, tmp_path, [str(script)])
    deadline = time.monotonic() + 30
    while "up" not in log.read_text():
        assert time.monotonic() < deadline and child.poll() is None, log.read_text()
        time.sleep(0.02)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    child.kill()  # ended: a no-op, as with Popen


def test_children_are_independent(zygote, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    (first, first_log), (second, second_log) = (spawn(zygote, tmp_path, [str(script)], MARKER=m) for m in "ab")
    assert first.wait(30) == second.wait(30) == 0 and first.pid != second.pid
    assert [json.loads(log.read_text().splitlines()[0])["marker"] for log in (first_log, second_log)] == ["a", "b"]


def test_an_ended_child_reports_the_cpu_it_used(zygote, tmp_path):
    """What tests/support/cpu_profile.py counts per test: a child's CPU, as the zygote reaped it."""
    script = tmp_path / "spin.py"
    script.write_text("import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n")
    before = Zygote.ended_children_cpu
    child, _ = spawn(zygote, tmp_path, [str(script)])
    assert child.wait(30) == 0
    assert 0.3 <= Zygote.ended_children_cpu - before < 5


def test_run_python_answers_as_subprocess_run_does(tmp_path):
    """tests.conftest.run_python: stdout and stderr apart, the exit status, check=True's
    CalledProcessError, and a child past its timeout killed and raised as TimeoutExpired."""
    from tests.conftest import run_python

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = run_python([sys.executable, str(script)], env={"PATH": "/usr/bin:/bin", "MARKER": "r", "EXIT": "2"}, timeout=30)
    assert done.returncode == 2 and json.loads(done.stdout)["marker"] == "r" and done.stderr == "to stderr\n"
    with pytest.raises(subprocess.CalledProcessError):
        run_python([sys.executable, str(script)], env={"EXIT": "1"}, timeout=30, check=True)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as late:
        run_python([sys.executable, str(sleeper)], env={}, timeout=1)
    assert time.monotonic() - started < 15 and late.value.output == "started\n"


def test_a_child_ends_as_the_interpreter_would_have_it_end(zygote, tmp_path):
    """end_child: its non-daemon threads finish and its atexit functions run (before
    os._exit skips the interpreter's finalization); sys.exit("message") prints the message
    and exits 1, as the interpreter does."""
    script = tmp_path / "ending.py"
    script.write_text(
        "import atexit, sys, threading, time\n"
        "done = []\n"
        "def late():\n    time.sleep(0.3)\n    done.append('thread')\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(lambda: print('atexit after', done, flush=True))\n"
        "sys.exit(sys.argv[1] if sys.argv[1:] else None)\n")
    child, log = spawn(zygote, tmp_path, [str(script)])
    assert child.wait(30) == 0
    assert log.read_text() == "atexit after ['thread']\n"
    child, log = spawn(zygote, tmp_path, [str(script), "refused: no token"])
    assert child.wait(30) == 1
    assert log.read_text().splitlines() == ["atexit after ['thread']", "refused: no token"]


def _parent(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


@pytest.mark.e2e
def test_a_repeated_start_is_forked_from_a_sub_zygote_and_registers_itself(processes):
    """The same worker started three times (one environment): the third at the latest is
    forked from a sub-zygote set up for it (tests/support/zygote_product.py), a child of
    the zygote, and
    is the process a fresh start would be: registered in the metrics folder under its own
    pid (the sub-zygote is not), beating, and stopped cleanly."""
    from tests.conftest import METRICS_DIR, _the_zygote

    zygote = _the_zygote().process.pid
    workers = [processes.worker() for _ in range(3)]
    parents = [_parent(worker.pid) for worker in workers]
    assert parents[2] != zygote and _parent(parents[2]) == zygote
    registered = {int(path.stem) for path in METRICS_DIR.glob("*.pid")}
    assert {worker.pid for worker in workers} <= registered and parents[2] not in registered
    assert not list(METRICS_DIR.glob(f"*_{parents[2]}.db"))
    for worker in workers:
        assert worker.stop() == 0, worker.output()
    assert "stopped after 0 turns" in workers[2].output()
