"""The product's processes, forked from an interpreter that has already imported the
libraries they all import (tests only).

A test starts a few hundred web servers and workers per pass; each fresh interpreter spent
about a second of CPU importing Django, psycopg, httpx, uvicorn and the rest before it ran
a line of ours: four tenths of the busy phase's CPU. Here one process per pytest process
(the zygote) imports those libraries once, then forks a child per start; the child takes
the test's environment, working directory, log file and arguments and runs
`python manage.py …` or `python -m …` exactly as a fresh interpreter would (`runpy`,
`__main__`, `sys.argv`), with the settings, the apps and everything of ours imported by
the child itself. What is preloaded reads no settings and no environment at import time,
so no test's environment can leak into another's process (gunicorn's `--preload` is the
same idea). Nothing of the product is changed by it; `AGENTLOOP_TEST_FORK=0` starts every
process the plain way.

    python -m tests.support.zygote <fd of its end of a socketpair>

Requests and answers are JSON lines: {"spawn": n, "argv", "env", "cwd", "log"[, "stderr"]} is
answered {"spawned": n, "pid"}; each child's end is reported {"exited": pid, "code", "cpu"}
with subprocess's sign (-N: killed by signal N) and the CPU seconds it and the processes
it waited for used.
"""

import gc
import importlib
import io
import itertools
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback

# Each imported, nothing else done: no settings read, no reactor installed, no thread,
# and no variable a test sets read at import time. prometheus_client is not here: it
# chooses its multiprocess mode from PROMETHEUS_MULTIPROC_DIR when imported, which the
# settings set per test (AGENTLOOP_METRICS_DIR); nor is OpenTelemetry (OTEL_*), nor the
# MCP SDK (kept out of web servers and workers, tests/unit/test_layers.py).
PRELOAD = (
    "django.db.models", "django.http", "django.urls", "django.core.management", "django.core.handlers.asgi",
    "django.template.backends.django", "django.forms", "django.contrib.admin.options",
    "psycopg", "psycopg_pool", "httpx", "jsonschema", "openai", "telegram",
    "uvicorn.main", "uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.websockets.websockets_sansio_impl",
    "uvloop", "asgiref.sync", "sqlparse", "environ", "yaml",
    # What the children imported next (sampled: a third of their CPU went to module bodies):
    # django.test and requests under the URLconf (DRF's and drf-spectacular's test helpers),
    # Slack's SDK, icalendar, markdown (DRF's browsable API), channels, filetype, dateutil.
    # Not DRF, drf-spectacular, django-q2 or axes themselves: they read settings when imported.
    "django.test", "requests", "slack_sdk.web.async_client", "slack_sdk.signature", "icalendar", "markdown",
    "channels.layers", "channels.generic.websocket", "filetype", "dateutil.parser", "uritemplate",
    # The platforms' own libraries, which every web server and worker imports with the
    # platforms (AGENTLOOP_PLATFORMS): Teams' activity models (pydantic), google-auth and
    # PyJWT for the tokens Google Chat and Teams send, discord.py for the Gateway's opcodes.
    "microsoft_agents.activity", "google.auth.jwt", "google.auth.transport.requests", "google.oauth2.id_token",
    "google.oauth2.service_account", "jwt", "discord", "websockets.asyncio.client",
)
NEVER_PRELOADED = ("prometheus_client", "opentelemetry", "mcp")


def preload():
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- a module that cannot preload is imported by the child itself
            pass
    preloaded = [name for name in NEVER_PRELOADED if name in sys.modules]
    assert not preloaded, f"imported by a preloaded module, and must not be: {preloaded}"


def main():
    channel = socket.socket(fileno=int(sys.argv[1]))
    preload()
    # The preloaded heap (about 200,000 objects) out of the collector's sight, in every
    # child: otherwise each child's first full collection walked all of it during its own
    # django.setup(), 0.12 s of a 0.28 s setup (measured), and every later one again.
    # Python's documented recipe for fork without exec (gc.freeze).
    gc.collect()
    gc.freeze()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what matters
    children, pending = set(), b""
    while True:
        try:
            ready, _, _ = select.select([channel, wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in ready:
            os.read(wake_read, 4096)
            reap(channel, children)
        if channel in ready:
            data = channel.recv(65536)
            if not data:  # pytest is gone: so are its processes
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    for fd in (channel.fileno(), wake_read, wake_write):
                        os.close(fd)
                    sys.exit(run_child(request))  # the interpreter's own exit: atexit, threads joined
                children.add(pid)
                send(channel, {"spawned": request["spawn"], "pid": pid})


def reap(channel, children):
    while children:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        send(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status),
                       "cpu": usage.ru_utime + usage.ru_stime})


def send(channel, message):
    channel.sendall(json.dumps(message).encode() + b"\n")


def run_child(request):
    """In the forked child: become `python <argv…>` with the test's environment."""
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    errors = os.open(request.get("stderr") or request["log"], os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(errors, 2)
    os.closerange(3, 1 << 16)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- the process's own standard streams
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True,
                                  errors="backslashreplace")
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = request["argv"][1:]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as done:
        return done.code
    except BaseException:  # noqa: BLE001 -- printed as the interpreter would, then exit 1
        traceback.print_exc()
        return 1
    return 0


# --- the pytest side --------------------------------------------------------------------


class Zygote:
    """The zygote of this pytest process, started on first use; `spawn` returns a child
    that answers as subprocess.Popen does (pid, poll, wait, send_signal, kill, terminate,
    returncode): the tests' Process holds either."""

    # CPU seconds of this process's forked children that have ended, all its zygotes'
    # (tests/support/cpu_profile.py).
    ended_children_cpu = 0.0

    def __init__(self, base_dir, log_path):
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}  # preloading reads no settings
        self.log = open(log_path, "ab")  # noqa: SIM115 -- open as long as the zygote runs
        self.process = subprocess.Popen([sys.executable, "-m", "tests.support.zygote", str(theirs.fileno())],
                                        cwd=base_dir, env=env, pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        theirs.close()
        self.channel, self.lock = ours, threading.Lock()
        self.numbers = itertools.count(1)
        self.spawned, self.children = {}, {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, name="zygote", daemon=True).start()

    def spawn(self, argv, env, cwd, log_path, stderr_path=None):
        """A child writing to `log_path` (and its standard error to `stderr_path`, if given)."""
        number = next(self.numbers)
        request = {"spawn": number, "argv": argv, "env": env, "cwd": str(cwd), "log": str(log_path)}
        if stderr_path is not None:
            request["stderr"] = str(stderr_path)
        with self.lock:
            send(self.channel, request)
        with self.changed:
            if not self.changed.wait_for(lambda: number in self.spawned or self.process.poll() is not None, 30):
                raise RuntimeError("the zygote did not answer within 30 s")
            if number not in self.spawned:
                raise RuntimeError(f"the zygote ended (exit {self.process.returncode})")
            return self.spawned.pop(number)

    def _read(self):
        for line in self.channel.makefile("rb"):
            message = json.loads(line)
            with self.changed:
                if "spawned" in message:  # always read before that child's end
                    child = self.children[message["pid"]] = ForkedChild(self, message["pid"])
                    self.spawned[message["spawned"]] = child
                else:
                    self.children.pop(message["exited"]).returncode = message["code"]
                    Zygote.ended_children_cpu += message["cpu"]
                self.changed.notify_all()
        with self.changed:  # the zygote is gone
            self.changed.notify_all()

    def stop(self):
        self.channel.shutdown(socket.SHUT_RDWR)  # the zygote reads its end: it kills what is left and exits
        self.channel.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        if os.path.getsize(self.log.name) == 0:  # nothing to read: not one more file a run leaves in /tmp
            os.unlink(self.log.name)


class ForkedChild:
    """subprocess.Popen's surface for a process the zygote forked (and reaps)."""

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        with self.zygote.changed:
            if not self.zygote.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, number):
        if self.returncode is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:  # ended, its end not yet read from the zygote
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    main()
