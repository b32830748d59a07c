"""`manage.py recording export --conversation N [--mask] -o FILE`: a conversation's
recording (agentloop.console.replay.recording), for `manage.py replay`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentloop.console.replay import document, recording


class Command(BaseCommand):
    help = "Export a conversation's recording (its messages with their timing, and what happened) as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["export"], help="export: write a conversation's recording.")
        parser.add_argument("--conversation", type=int, required=True, help="The conversation's id.")
        parser.add_argument("--mask", action="store_true", help="Replace names, platform ids and phone numbers "
                                                                "with stable stand-ins.")
        parser.add_argument("-o", "--output", default="-", help="The file to write (default: standard output).")

    def handle(self, *args: Any, action: str, conversation: int, mask: bool, output: str, **options: Any) -> None:
        try:
            text = document.dumps(recording.export(conversation, mask=mask))
        except document.RecordingError as exc:
            raise CommandError(str(exc)) from None
        if output == "-":
            sys.stdout.write(text)
            return
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"{output}: cannot be written ({exc.strerror})") from None
        self.stderr.write(f"conversation {conversation} recorded in {output}{' (masked)' if mask else ''}")
