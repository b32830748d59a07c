import asyncio
import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from agentloop.core import collector
from conversations.worker import Worker

SWITCH_INTERVAL = 0.0005  # seconds


class Command(BaseCommand):
    help = ("Run the worker loop: debounce flushes on time, turns, replies, Telegram polling. "
            "Run as many as you like side by side.")
    # Django's system checks are a deploy-time matter (`manage.py check --deploy`; `migrate`
    # runs them too): here they cost every worker start 1.2 s of CPU, importing the web
    # stack (URLs, admin, API schema) a worker never serves.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-polling", "--no-telegram-polling", dest="no_polling", action="store_true",
                            help="Run no platform pollers (Telegram's getUpdates) in this worker.")

    def handle(self, *args: Any, **options: Any) -> None:
        # A thread that wakes (the flusher at a deadline) waits for the GIL until the
        # running thread gives it up: at most the switch interval, 5 ms by default.
        sys.setswitchinterval(SWITCH_INTERVAL)
        worker = Worker(poll=not options["no_polling"])
        collector.tune_for_bursts()
        if connection.vendor == "sqlite":  # the log copied into the file out of the write lock
            connection.start_checkpoints()  # type: ignore[attr-defined]  # our SQLite backend's (agentloop.core.sqlite)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.request_stop)
            await worker.run()

        asyncio.run(main())
        self.stdout.write(f"worker {worker.owner} stopped after {worker.turns_done} turns")
