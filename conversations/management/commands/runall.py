"""Start every process the product needs, in the foreground, in this process group.

Ctrl-C / SIGTERM stops them all; if one dies, the others are stopped too. Children are
not put in sessions of their own, so `kill -- -<pgid>` leaves no orphan.
"""

import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

# The web process's niceness beside the worker's 0 (issue 57). On a machine both share,
# a spike's intake took the cores and the replies waited: on PostgreSQL, 2 cores, 20 s
# of the peer benchmark's load (a new chat per POST), the worker had sent 1,505 replies
# of 18,800 messages when the load ended (8 %); with the web at niceness 10 it had sent
# 11,108 of 14,400 (77 %), while the web still accepted 720 POSTs/s against 940 (the
# Chat SDK peer's best: 374-442). Under no contention niceness changes nothing.
WEB_NICENESS = 10


def processes(host: str, port: int, web_nice: int = WEB_NICENESS) -> dict[str, list[str]]:
    python = sys.executable
    return {
        # No access log line per request unless ACCESS_LOG=true: like the routine INFO
        # lines silenced in settings.LOGGING, it cost the web process a formatted write
        # per webhook POST (its URLs masked by agentloop.web_server).
        "web": [python, "-m", "agentloop.web_server", "--host", host, "--port", str(port),
                *(["--access-log"] if access_log() else []), *(["--nice", str(web_nice)] if web_nice else [])],
        "worker": [python, "manage.py", "runloop"],
        "tasks": [python, "manage.py", "qcluster"],
    }


def access_log() -> bool:
    return os.environ.get("ACCESS_LOG", "").lower() in ("1", "true", "yes", "on")


# Seconds each process gets to stop. The worker hands its running turns back; the
# django-q2 cluster, when its own children got the signal too (Ctrl-C reaches the
# whole process group), can wait forever for them, and holds nothing worth waiting for.
GRACE = {"web": 10, "worker": 15, "tasks": 3}


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name (or 0.0.0.0's cousins): assume others can reach it


def debug_warning(host: str, port: int) -> str:
    line = "!" * 78
    return "\n".join([
        line,
        f"!! WARNING: DEBUG=true on {host}:{port}, which is not a loopback address.",
        "!! Anyone who can reach this port sees Django's debug pages: settings, source code,",
        "!! SQL and tracebacks. Run without DEBUG (the default), or bind HOST=127.0.0.1.",
        line,
    ]) + "\n"


def admin_password(info: Mapping[str, str]) -> str:
    """The password on the run that created the admin user; afterwards where it is kept
    (a change made in the admin is never undone, so the first one may be out of date)."""
    if info.get("admin_password"):
        return f"{info['admin_password']}   (set now; not shown again)"
    if info.get("admin_password_from") == "ADMIN_PASSWORD":
        return "as set (first from ADMIN_PASSWORD when the user was created)"
    return "as set (the first one generated is in var/admin_password)"


class Command(BaseCommand):
    help = "Run the web server, the worker loop and the django-q2 cluster together."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--web-nice", type=int, default=WEB_NICENESS,
                            help="the web process's niceness: replies before intake on a shared machine (0: none)")

    def handle(self, *args: Any, host: str, port: int, web_nice: int = WEB_NICENESS, **options: Any) -> None:
        if settings.DEBUG and not is_loopback(host):
            self.stderr.write(debug_warning(host, port))
        children = {name: subprocess.Popen(cmd, cwd=settings.BASE_DIR)
                    for name, cmd in processes(host, port, web_nice).items()}
        stopping = False

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if self.wait_for_web(host, port, children["web"]):
            self.banner(host, port)
        try:
            while not stopping:
                exited = {n: p.returncode for n, p in children.items() if p.poll() is not None}
                if exited:
                    self.stderr.write(f"process exited: {exited}; stopping the others")
                    break
                time.sleep(0.2)
        finally:
            self.stop_all(children)
        if not stopping:
            sys.exit(1)

    def stop_all(self, children: dict[str, subprocess.Popen[bytes]]) -> None:
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        for name, proc in children.items():
            try:
                proc.wait(timeout=max(0.1, started + GRACE[name] - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait_for_web(self, host: str, port: int, web: subprocess.Popen[bytes], timeout: float = 60) -> bool:
        """The URLs are printed once they answer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and web.poll() is None:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def banner(self, host: str, port: int) -> None:
        info: dict[str, str] = {}
        path = settings.VAR_DIR / "bootstrap.env"
        if path.exists():
            info = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        base = f"http://{host}:{port}"
        lines = [
            "",
            "agentloop is running (Ctrl-C stops everything)",
            f"  admin:     {base}/admin/   user: admin   password: {admin_password(info)}",
            f"  dashboard: {base}/console/   (live; staff only)",
            f"  playground: {base}/console/playground/   (chat with the demo agent, watch the layers work)",
            f"  API docs:  {base}/api/docs/   (schema: {base}/api/schema/)",
            f"  demo channel 'demo' (demo agent: try \"agéndame psicología el lunes a las 10\"), agent key: {info.get('demo_key', '?')}",
            f"    curl -X POST {base}/api/v1/channels/demo/messages \\",
            f"      -H 'Authorization: Bearer {info.get('demo_key', '?')}' -H 'Content-Type: application/json' \\",
            "      -d '{\"message_id\": \"1\", \"contact\": \"ana\", \"text\": \"hola\"}'",
            "  its replies: <id> is the \"conversation\" of the POST's answer; the first read lists the conversation,",
            "  then pass its \"next\" as &after=<next> and the read waits up to 25 s for the reply (no callback URL needed):",
            f"    curl '{base}/api/v1/conversations/<id>/messages?wait=25' \\",
            f"      -H 'Authorization: Bearer {info.get('demo_key', '?')}'",
            "  a tool behind the action guard (run it twice: the second is a duplicate, see the admin):",
            f"    curl -X POST {base}/api/v1/tools/calendar_create_event/invoke \\",
            f"      -H 'Authorization: Bearer {info.get('demo_key', '?')}' -H 'Content-Type: application/json' \\",
            "      -d '{\"scope\": \"ana\", \"arguments\": {\"title\": \"Psicología\", "
            "\"start_datetime\": \"2026-12-01T10:00\"}}'",
        ]
        lines += [f"  {line}" for name, line in sorted(info.items()) if name.startswith("platform_")]
        self.stdout.write("\n".join(lines) + "\n")
        self.stdout.flush()
