from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from conversations import retention


class Command(BaseCommand):
    help = "Delete data past its retention now (what django-q2 runs every 10 minutes), within a time budget."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--budget", type=float, default=None,
                            help="Seconds (default AGENTLOOP_RETENTION_SWEEP_BUDGET).")

    def handle(self, *args: Any, budget: float | None, **options: Any) -> None:
        deleted = retention.sweep(budget_seconds=budget)
        for label, count in sorted(deleted.items()):
            self.stdout.write(f"{label}: {count}")
        if not deleted:
            self.stdout.write("nothing past its retention")
