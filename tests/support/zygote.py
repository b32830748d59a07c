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

A start that repeats one already seen (the same command, directory and environment) is
forked from a sub-zygote that has set the product itself up for exactly that start
(tests/support/zygote_product.py), and every child ends as multiprocessing's forked
processes do (`end_child`). A worker's start and stop took 0.55-0.65 s of CPU forked from
here and take 0.10-0.14 s from a sub-zygote; a web server's, 0.05 s.

    python -m tests.support.zygote <fd of its end of a socketpair>

Requests and answers are JSON lines: {"spawn": n, "argv", "env", "cwd", "log"[, "stderr"]} is
answered {"spawned": n, "pid"}; each child's end is reported {"exited": pid, "code", "cpu"}
with subprocess's sign (-N: killed by signal N) and the CPU seconds it and the processes
it waited for used.
"""

import atexit
import collections
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
import tempfile
import threading
import traceback
from pathlib import Path

from tests.support import zygote_product

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
    Server(channel, subs=MAX_SUBS).serve()


# Sub-zygotes (tests/support/zygote_product.py) a zygote keeps, the least recently used
# retired first: a web server's and a worker's for the two environments a file uses most.
# AGENTLOOP_TEST_SUBZYGOTES=0 forks every start from the first zygote.
MAX_SUBS = int(os.environ.get("AGENTLOOP_TEST_SUBZYGOTES", "4"))
SEEN = 512  # the starts' keys remembered (a bounded count: a key is a whole environment)


class Sub:
    """A sub-zygote, as its zygote sees it: its channel, whether its set-up succeeded
    (None: not yet said), the requests waiting for that answer."""

    def __init__(self, pid, channel):
        self.pid, self.channel = pid, channel
        self.ready, self.waiting, self.pending = None, [], b""


class Server:
    """A zygote's loop: a child forked per request, its end reported. The first zygote
    (`subs` > 0) hands a start it has seen before to a sub-zygote for it (`Sub`), and
    relays what that one reports; a sub-zygote serves its own requests until retired."""

    def __init__(self, upstream, subs=0):
        self.upstream, self.max_subs = upstream, subs
        self.children, self.pending, self.retiring = set(), b"", False
        self.subs = collections.OrderedDict()  # key -> Sub, the least recently used first
        self.retired = {}  # channel -> Sub, relayed until it ends
        self.seen = collections.OrderedDict()  # key -> starts
        self.refused = set()  # keys whose set-up failed: forked plainly
        self.wake_read, wake_write = os.pipe()
        self.wake_write = wake_write
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what matters

    def channels(self):
        return [self.upstream, self.wake_read, *(sub.channel for sub in self.subs.values()), *self.retired]

    def serve(self):
        while True:
            try:
                ready, _, _ = select.select(self.channels(), [], [])
            except InterruptedError:
                continue
            if self.wake_read in ready:
                os.read(self.wake_read, 4096)
                self.reap()
            for sub in [*self.subs.values(), *self.retired.values()]:
                if sub.channel in ready:
                    self.relay(sub)
            if self.upstream in ready:
                data = self.upstream.recv(65536)
                if not data:  # pytest (or the first zygote) is gone: so are its processes
                    for pid in self.children:
                        os.kill(pid, signal.SIGKILL)
                    return
                self.pending += data
                while b"\n" in self.pending:
                    line, self.pending = self.pending.split(b"\n", 1)
                    self.handle(json.loads(line))
            if self.retiring and not self.children:
                return

    def handle(self, request):
        if "retire" in request:  # a sub-zygote no longer used: ends with its last child
            self.retiring = True
            return
        sub = self.sub_for(request)
        if sub is None:
            self.fork_child(request)
        elif sub.ready is None:
            sub.waiting.append(request)
        else:
            send(sub.channel, request)

    def sub_for(self, request):
        key = zygote_product.key(request) if self.max_subs else None
        if key is None or key in self.refused:
            return None
        if key in self.subs:
            self.subs.move_to_end(key)
            return self.subs[key]
        self.seen[key] = self.seen.pop(key, 0) + 1
        while len(self.seen) > SEEN:
            self.seen.popitem(last=False)
        if self.seen[key] < 2:
            return None  # a start seen once: a sub-zygote pays only from its third
        while len(self.subs) >= self.max_subs:
            _, old = self.subs.popitem(last=False)
            send(old.channel, {"retire": True})
            self.retired[old.channel] = old
        self.subs[key] = self.fork_sub(request)
        return self.subs[key]

    def fork_child(self, request):
        pid = os.fork()
        if pid == 0:
            self.close_in_child()
            end_child(run_child(request))
        self.children.add(pid)
        send(self.upstream, {"spawned": request["spawn"], "pid": pid})

    def fork_sub(self, request):
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self.close_in_child()
            sys.exit(run_sub(theirs, request))
        theirs.close()
        return Sub(pid, ours)

    def close_in_child(self):
        signal.set_wakeup_fd(-1)
        for channel in self.channels():
            if isinstance(channel, socket.socket):
                channel.close()
        for fd in (self.wake_read, self.wake_write):
            os.close(fd)

    def relay(self, sub):
        """What a sub-zygote says: whether it is ready (then the requests that waited for
        it go to it, or are forked here if it is not), its children's starts and ends
        (passed on as they are), or its end."""
        data = sub.channel.recv(65536)
        if not data:
            sub.channel.close()
            self.retired.pop(sub.channel, None)
            for key, each in list(self.subs.items()):
                if each is sub:  # ended unasked: its key's starts are forked here from now on
                    del self.subs[key]
                    self.refused.add(key)
            waiting, sub.waiting = sub.waiting, []
            for request in waiting:  # ended before it was ready: their starts are still owed
                self.fork_child(request)
            return
        sub.pending += data
        while b"\n" in sub.pending:
            line, sub.pending = sub.pending.split(b"\n", 1)
            message = json.loads(line)
            if "ready" not in message:
                self.upstream.sendall(line + b"\n")
                continue
            sub.ready = message["ready"]
            waiting, sub.waiting = sub.waiting, []
            for request in waiting:
                if sub.ready:
                    send(sub.channel, request)
                else:
                    self.fork_child(request)

    def reap(self):
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:  # not a sub-zygote: its end is its channel's
                self.children.discard(pid)
                send(self.upstream, {"exited": pid, "code": os.waitstatus_to_exitcode(status),
                                     "cpu": usage.ru_utime + usage.ru_stime})


def end_child(code):
    """A forked child's end as multiprocessing ends its forked processes (popen_fork:
    `os._exit` after the process's own shutdown): its threads joined and its atexit
    functions run (logging flushed, weakref finalizers, the metrics directory left) as the
    interpreter's own exit does them, then out without the interpreter's finalization,
    which freed every object of the preloaded heap one by one and touched, so copied,
    each page of it: 0.1-0.13 s of CPU per end (measured), of a worker's 0.28 s."""
    threading._shutdown()  # the wait for non-daemon threads the interpreter does first
    atexit._run_exitfuncs()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, exit status 1
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF)


def run_sub(channel, request):
    """In a new sub-zygote: set the product up as `request`'s start does, say whether it
    could, then fork such starts until retired (or until the first zygote ends)."""
    signal.set_wakeup_fd(-1)
    folder = Path(tempfile.gettempdir())
    ready = zygote_product.set_up(request, folder, channel.fileno())
    send(channel, {"ready": ready})
    if ready:
        gc.collect()
        gc.freeze()
        Server(channel).serve()
    zygote_product.forget_output()
    return 0


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
    zygote_product.close_all_but_kept(3)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- the process's own standard streams
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True,
                                  errors="backslashreplace")
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = request["argv"][1:]
    try:
        zygote_product.after_fork()  # a sub-zygote's child: what its set-up printed and registered
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
