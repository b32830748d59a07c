"""The directory the product's processes share their Prometheus metrics through
(prometheus-client's multiprocess mode), prepared by settings.py before anything imports
prometheus_client (which picks its mode from PROMETHEUS_MULTIPROC_DIR at import).

Each process writes its values into memory-mapped files of its own (`counter_<pid>.db`,
…): an `inc()` is a write into memory under a lock of the process, no file lock, no
system call. `GET /metrics` reads every file of the directory and sums them.

Only the product's long-running processes take part — the web server, the worker loop,
the django-q2 cluster, `runall` and `runserver`. A one-off command or a test run keeps its
metrics in memory and leaves the directory alone.

The library asks for the directory to be wiped before a deployment starts, and for a dead
process's live gauges to be removed. Here each process does it as it starts, under an
exclusive lock on the directory: it registers itself (`<pid>.pid`), and if no process it
finds registered is alive, this is a new start — everything of the last run is wiped;
otherwise the live gauges of registered processes that died are removed (their counters
stay: a counter never goes down while the deployment runs). The directory belongs to one
host (one pid space): never share it between hosts or containers.
"""

import atexit
import fcntl
import os
import re
from collections.abc import Sequence
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
# manage.py commands that are the product's processes (the Procfile's, and `make run`'s).
COMMANDS = {"runloop": "worker", "qcluster": "tasks", "runall": "runall", "runserver": "web"}
_DB_FILE = re.compile(r"^(?P<kind>[a-z]+(?:_[a-z]+)?)_(?P<pid>\d+)\.db$")


def process_kind(argv: Sequence[str]) -> str:
    """`web`, `worker`, `tasks`, `runall`, or "" for anything else."""
    if not argv:
        return ""
    path = Path(argv[0])
    if path.name in ("web_server.py", "uvicorn") or (path.name == "__main__.py" and path.parent.name == "uvicorn"):
        return "web"
    program = path.name
    if program == "manage.py" and len(argv) > 1:
        return COMMANDS.get(argv[1], "")
    return ""


def use(directory: str | os.PathLike[str] | None) -> Path | None:
    """Point prometheus-client at `directory` (prepared), or at none (None: this process
    keeps its metrics in memory)."""
    if directory is None:
        os.environ.pop(ENV, None)
        return None
    path = Path(directory)
    prepare(path)
    os.environ[ENV] = str(path)
    atexit.register(leave, path, os.getpid())
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def prepare(directory: Path, pid: int | None = None) -> bool:
    """Register `pid` (this process) in `directory`; True if the directory was wiped
    (no registered process was alive)."""
    pid = pid or os.getpid()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        registered = {int(path.stem) for path in directory.glob("*.pid") if path.stem.isdigit()}
        living = {other for other in registered - {pid} if alive(other)}
        if not living:
            for path in [*directory.glob("*.db"), *directory.glob("*.pid")]:
                path.unlink(missing_ok=True)
        else:
            for dead in registered - living - {pid}:
                remove_live_gauges(directory, dead)
                (directory / f"{dead}.pid").unlink(missing_ok=True)
        (directory / f"{pid}.pid").touch()
        return not living


def remove_live_gauges(directory: Path, pid: int) -> None:
    """What prometheus_client.multiprocess.mark_process_dead does, without importing it."""
    for path in directory.glob(f"gauge_live*_{pid}.db"):
        path.unlink(missing_ok=True)


def forget_the_dead(directory: Path) -> None:
    """Remove the live gauges of every process that died (a SIGKILL leaves them behind);
    run before a scrape reads the directory."""
    for path in directory.glob("gauge_live*.db"):
        match = _DB_FILE.match(path.name)
        if match and not alive(int(match["pid"])):
            path.unlink(missing_ok=True)


def leave(directory: Path, pid: int) -> None:
    """At a clean exit: this process's live gauges go; its counters stay."""
    if os.getpid() != pid:  # a forked child inherits atexit handlers
        return
    remove_live_gauges(directory, pid)
    (directory / f"{pid}.pid").unlink(missing_ok=True)
