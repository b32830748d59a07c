"""What `make run` does before starting the processes: migrate, an admin user, a demo
channel with an agent key, the playground's web chat channel, and each platform's
channel the environment names (Platform.bootstrap: e.g. TELEGRAM_BOT_TOKEN). Idempotent
and quiet on a second run.

The admin's password is set when the user is created (ADMIN_PASSWORD, or one generated
and kept in var/admin_password), never again: a change made in the admin stays. It is in
var/bootstrap.env (and so in `make run`'s banner) only on the run that created the user.
Every file here is written owner-only from its first byte (write_private)."""

import os
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from agentloop.core.secret_file import write_private
from conversations import agent_keys, platforms
from conversations.models import AgentKey, Channel
from tools.guard import ensure_policies


def _remembered(name: str, make: Callable[[], str]) -> tuple[str, bool]:
    """A generated secret kept under var/ (mode 0600) so every run can print it again."""
    path = settings.VAR_DIR / name
    if path.exists():
        kept: str = path.read_text().strip()
        return kept, False
    value = make()
    write_private(path, value)
    return value, True


class Command(BaseCommand):
    help = "Migrate and create the admin user and the demo channel (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        admin = self.admin_user()
        key = self.demo_channel()
        self.playground_channel()
        # Each line `make run` prints about a platform's channel (runall reads them back).
        said = [line for platform in platforms.all_platforms() if (line := platform.bootstrap(self.stdout))]
        ensure_policies()  # every tool's policy is in the admin from the start
        info = {"admin_user": "admin", **admin, "demo_key": key,
                **{f"platform_{n}": line for n, line in enumerate(said)}}
        write_private(settings.VAR_DIR / "bootstrap.env", "".join(f"{k}={v}\n" for k, v in info.items()))

    def admin_user(self) -> dict[str, str]:
        """The admin user, created with its password if missing. Returns what the banner
        says of the password: the password itself on the run that set it, else where it
        came from."""
        User = get_user_model()
        user = User.objects.filter(username="admin").first()
        if user is not None:
            if not (user.is_staff and user.is_superuser):
                user.is_staff = user.is_superuser = True
                user.save(update_fields=["is_staff", "is_superuser"])
            came_from = "ADMIN_PASSWORD" if os.environ.get("ADMIN_PASSWORD") else "var/admin_password"
            return {"admin_password_from": came_from}
        password = os.environ.get("ADMIN_PASSWORD") or _remembered(
            "admin_password", lambda: secrets.token_urlsafe(12))[0]
        User.objects.create_superuser("admin", email="", password=password)
        return {"admin_password": password}

    def demo_channel(self) -> str:
        channel, _ = Channel.objects.get_or_create(
            slug="demo", defaults={"name": "Demo (API, demo agent)", "kind": "api", "agent": "demo"})
        raw, fresh = _remembered("demo_agent_key", lambda: "")
        if not raw or AgentKey.objects.for_key(raw) is None:
            key, raw = agent_keys.issue("demo", [channel], by="manage.py bootstrap")
            write_private(settings.VAR_DIR / "demo_agent_key", raw)
        return raw

    def playground_channel(self) -> None:
        """The console's playground talks to this web chat channel."""
        Channel.objects.get_or_create(slug="playground", defaults={
            "name": "Playground (web chat, demo agent)", "kind": "webchat", "agent": "demo"})
