from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class ConsoleConfig(AppConfig):
    """The top layer (.importlinter): the operator console (dashboard, playground, story
    page, live updates' relay, websockets) and the roles operators and auditors log in
    with."""

    name = "agentloop.console"
    label = "console"
    verbose_name = _("Console")

    def ready(self) -> None:
        # Imported here, not at the top: roles imports auth's models, which the app
        # registry cannot give before it is ready.
        from agentloop.console.roles import on_post_migrate

        # Once per migrate, after every app's tables exist: post_migrate is sent per app
        # with models, in INSTALLED_APPS order, and this app has none; agentloop.core's
        # (label `agentloop`) is the last.
        post_migrate.connect(on_post_migrate, sender=apps.get_app_config("agentloop"), dispatch_uid="agentloop.console.roles")
