"""The second stage of tests/support/zygote.py: a zygote of its own per repeated product
start, the product already set up in it (tests only).

The zygote preloads only libraries that read no settings, so every web server and worker
it forked still ran django.setup(), built the models, the admin and the URLconf, and
imported the product: 0.55-0.65 s of CPU per start, measured to a worker's first heartbeat
and a web server's first /healthz (their stop included), against a test's few seconds of
work. A test file starts hundreds of them in each pass, most with the very same
environment. So when a start repeats one the zygote has seen — the same command
(`manage.py runloop`, `-m agentloop.web_server`), working directory and environment, the
variables of KEY_IGNORED aside — the zygote forks a sub-zygote that sets the product up
exactly as that start would (the same `sys.argv` as far as the settings read it, the same
environment), and every later such start is forked from it.

A child forked from it is the process a fresh start would have been:
- what the set-up printed (a settings warning, a log line) is written again at the head of
  its own log and standard error;
- the one thing settings.py does per process, registering it in the metrics directory
  (agentloop.core.metrics_dir), is done again for the child; the sub-zygote unregisters
  itself and removes the empty metric files its imports made;
- no database connection and no thread crosses the fork: the sub-zygote closes every
  connection its set-up opened, and gives up (its starts are forked plainly) if its set-up
  left a thread running or failed. A failed set-up is the child's to report, as before.
"""

import importlib.util
import os
import sys
import threading
import traceback
from pathlib import Path

# Starts a sub-zygote takes: the product's long-running processes, started by the tests
# hundreds of times each. A one-off command (migrate, addchannel) runs a few times a file.
COMMANDS = (("manage.py", "runloop"), ("-m", "agentloop.web_server"))
# Variables no import and no setting reads, which pytest sets per test.
KEY_IGNORED = frozenset({"PYTEST_CURRENT_TEST"})

# In a sub-zygote: the files its set-up's standard output and error went to (replayed at
# the head of each child's); None in the first zygote.
_preload_output: tuple[Path, Path] | None = None
# In a sub-zygote: the descriptors its set-up left open (prometheus-client's files of
# metric values), which what it imported owns and its children keep.
_kept_fds: frozenset[int] = frozenset()


def key(request) -> str | None:
    """What makes two starts the same set-up (None: a start no sub-zygote takes)."""
    argv = request["argv"]
    if tuple(argv[1:3]) not in COMMANDS:
        return None
    env = sorted((name, value) for name, value in request["env"].items() if name not in KEY_IGNORED)
    return repr((request["cwd"], argv[1:3], env))


def set_up(request, folder: Path, channel_fd: int) -> bool:
    """In a new sub-zygote: set the product up as `request`'s start would; True if it can
    fork such starts from here."""
    global _preload_output, _kept_fds
    out, err = (folder / f"agentloop-preload-{os.getpid()}.{stream}" for stream in ("out", "err"))
    saved = os.dup(1), os.dup(2)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    refusal = ""
    try:
        _become(request)
        _import_product(request["argv"])
        _leave_no_trace()
        if threading.active_count() != 1:
            refusal = f"{threading.active_count()} threads running after the set-up"
    except BaseException:  # noqa: BLE001 -- a set-up that fails is the child's own to fail (forked plainly)
        refusal = traceback.format_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
    if refusal:  # into the zygote's log
        os.write(2, f"zygote_product: no sub-zygote for {request['argv'][1:3]}: {refusal}\n".encode())
        forget_output(out, err)
        return False
    _preload_output = out, err
    _kept_fds = frozenset(_open_fds() - {0, 1, 2, channel_fd})
    return True


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def close_all_but_kept(lowest: int) -> None:
    """A forked child's descriptors from `lowest` up closed, but those its sub-zygote's
    set-up left open: closed here, their numbers would be taken by the child's next files
    while the objects owning them still write to them (a worker's SQLite database got a
    metric's values so: "disk I/O error")."""
    if not _kept_fds:
        os.closerange(lowest, 1 << 16)
        return
    for fd in _open_fds():
        if fd >= lowest and fd not in _kept_fds:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, gone by now
                pass


def forget_output(*paths: Path) -> None:
    """The set-up's output files, at the sub-zygote's end."""
    for path in paths or _preload_output or ():
        path.unlink(missing_ok=True)


def _become(request):
    """The start's working directory, environment and `sys.argv` (what settings.py reads
    of it: the program and the command) and `sys.path[0]`, as zygote.run_child sets them."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = request["argv"][1:]
    if args[0] == "-m":
        sys.argv = [importlib.util.find_spec(args[1]).origin]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = list(args[:2])
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")  # manage.py's and asgi.py's default


def _import_product(argv):
    import django

    django.setup()
    if argv[1] == "manage.py":
        from django.core.management import get_commands, load_command_class

        load_command_class(get_commands()[argv[2]], argv[2])
        _import_the_named()
    else:
        importlib.import_module("agentloop.asgi")
        from django.urls import get_resolver

        get_resolver().url_patterns  # noqa: B018 -- the URLconf, as the first request imports it


def _import_the_named():
    """The platforms, agents and tools the settings name by dotted path: the classes only
    (a process makes its instances when it first needs them, agentloop.core.plugins), as
    a worker imports them all at its start."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    for path in [*settings.AGENTLOOP_PLATFORMS.values(), *settings.AGENTLOOP_AGENTS.values(), *settings.AGENTLOOP_TOOLS]:
        try:
            import_string(path)
        except ImportError:  # the process that needs it says so, as before
            pass


def _leave_no_trace():
    """No connection for the children to share; no sign of this process in the metrics
    directory (its children register themselves: after_fork)."""
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    directory = settings.AGENTLOOP_METRICS_DIR
    if directory is not None:
        for path in [*directory.glob(f"*_{os.getpid()}.db"), directory / f"{os.getpid()}.pid"]:
            path.unlink(missing_ok=True)


def after_fork():
    """In a child of a sub-zygote, once its log is in place: what a fresh start would have
    printed and done while setting up."""
    if _preload_output is None:
        return
    for fd, path in zip((1, 2), _preload_output, strict=True):
        written = path.read_bytes()
        if written:
            os.write(fd, written)
    from django.conf import settings

    from agentloop.core import metrics_dir

    if settings.AGENTLOOP_METRICS_DIR is not None:
        metrics_dir.use(settings.AGENTLOOP_METRICS_DIR)
