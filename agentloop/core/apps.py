from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _


class CoreConfig(AppConfig):
    """The bottom layer (.importlinter): database helpers, the state machine, redaction
    and the publishing half of live updates. It imports no app of the product. Its two
    models (live updates) keep the label `agentloop` they were created under, so their
    tables and migration history stay as they are."""

    name = "agentloop.core"
    label = "agentloop"
    verbose_name = _("Core")

    def ready(self) -> None:
        # Imported here, as Django asks of ready(): not while the app registry loads.
        from django.conf import settings

        from agentloop.core import checks, redaction, tracing  # noqa: F401 -- checks: registers the deploy checks
        from agentloop.core.rows import register_lookups

        register_lookups()
        redaction.install_log_redaction()
        if settings.AGENTLOOP_PROCESS:
            # A product process that traces loads OpenTelemetry and starts its exporter now
            # (about 0.15 s), not while its first message waits (agentloop.core.tracing).
            tracing.on()
        # A lazy model reference: the channel model belongs to an app above this one.
        for signal in (post_save, post_delete):
            signal.connect(redaction.forget_secrets, sender="conversations.Channel",
                           dispatch_uid=f"agentloop.core.redaction.{signal is post_save}")
