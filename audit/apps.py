from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self):
        from audit import redaction

        redaction.install_log_redaction()
        for signal in (post_save, post_delete):
            signal.connect(redaction.forget_secrets, sender="conversations.Channel",
                           dispatch_uid=f"audit.redaction.{signal is post_save}")
