"""What `make run` does before starting the processes: migrate, an admin user, a demo
channel with an agent key, the playground's web chat channel, and each platform's
channel the environment names (Platform.bootstrap: e.g. TELEGRAM_BOT_TOKEN). Idempotent
and quiet on a second run."""

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from conversations import platforms
from conversations.models import AgentKey, Channel
from tools.guard import ensure_policies


def _remembered(name, make):
    """A generated secret kept under var/ (mode 0600) so every run can print it again."""
    path = settings.VAR_DIR / name
    if path.exists():
        return path.read_text().strip(), False
    value = make()
    settings.VAR_DIR.mkdir(exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(value)
    return value, True


class Command(BaseCommand):
    help = "Migrate and create the admin user and the demo channel (idempotent)."

    def handle(self, *args, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        password = self.admin_user()
        key = self.demo_channel()
        self.playground_channel()
        # Each line `make run` prints about a platform's channel (runall reads them back).
        said = [line for platform in platforms.all_platforms() if (line := platform.bootstrap(self.stdout))]
        ensure_policies()  # every tool's policy is in the admin from the start
        info = {"admin_user": "admin", "admin_password": password, "demo_key": key,
                **{f"platform_{n}": line for n, line in enumerate(said)}}
        (settings.VAR_DIR / "bootstrap.env").write_text("".join(f"{k}={v}\n" for k, v in info.items()))
        os.chmod(settings.VAR_DIR / "bootstrap.env", 0o600)

    def admin_user(self):
        User = get_user_model()
        password = os.environ.get("ADMIN_PASSWORD") or _remembered(
            "admin_password", lambda: secrets.token_urlsafe(12))[0]
        user, _ = User.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        if not user.check_password(password):
            user.set_password(password)
        user.is_staff = user.is_superuser = True
        user.save()
        return password

    def demo_channel(self):
        channel, _ = Channel.objects.get_or_create(
            slug="demo", defaults={"name": "Demo (API, demo agent)", "kind": "api", "agent": "demo"})
        raw, fresh = _remembered("demo_agent_key", lambda: "")
        if not raw or AgentKey.objects.for_key(raw) is None:
            key, raw = AgentKey.objects.issue("demo", [channel])
            (settings.VAR_DIR / "demo_agent_key").write_text(raw)
        return raw

    def playground_channel(self):
        """The console's playground talks to this web chat channel."""
        Channel.objects.get_or_create(slug="playground", defaults={
            "name": "Playground (web chat, demo agent)", "kind": "webchat", "agent": "demo"})
