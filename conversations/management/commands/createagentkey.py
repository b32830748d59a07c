import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from conversations import agent_keys
from conversations.models import Channel


class Command(BaseCommand):
    help = "Create an agent key (printed once; only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--channel", action="append", default=[], help="Channel slug (repeatable).")

    def handle(self, *args: Any, name: str, channel: list[str], **options: Any) -> None:
        channels = list(Channel.objects.filter(slug__in=channel))
        missing = set(channel) - {c.slug for c in channels}
        if missing:
            raise CommandError(f"unknown channel(s): {', '.join(sorted(missing))}")
        key, raw = agent_keys.issue(name, channels, by=f"manage.py createagentkey ({getpass.getuser()})")
        self.stdout.write(raw)
