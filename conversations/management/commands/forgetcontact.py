import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from conversations import erasure


class Command(BaseCommand):
    help = ("Erase one person's data (a data-protection request): their texts, files, names and ids; "
            "the audit trail keeps that it happened, the counts and who asked (docs/operations.md#erasure).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", required=True, help="The channel's slug.")
        parser.add_argument("--contact", required=True, help="The person's platform id in that channel.")
        parser.add_argument("--by", default="", help="Who asks (default: the shell's user).")
        parser.add_argument("--wait", type=float, default=30.0, help="Seconds to wait for a running turn.")

    def handle(self, *args: Any, channel: str, contact: str, by: str, wait: float, **options: Any) -> None:
        try:
            counts = erasure.forget(channel, contact, by=f"manage.py forgetcontact ({by or getpass.getuser()})",
                                    wait=wait)
        except (erasure.NotFound, erasure.Busy) as exc:
            raise CommandError(str(exc)) from None
        # The counts only: never the person's ids or texts (this output may be logged).
        self.stdout.write("erased: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
