from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AgentloopConfig(AppConfig):
    """The project's own app: the operator console (dashboard, playground, live
    updates) and the roles operators and auditors log in with."""

    name = "agentloop"
    verbose_name = "Console"

    def ready(self):
        from agentloop.roles import on_post_migrate
        from agentloop.rows import register_lookups

        register_lookups()

        # Once per migrate (sent with this app as the sender), after every app's tables exist.
        post_migrate.connect(on_post_migrate, sender=self, dispatch_uid="agentloop.roles")
