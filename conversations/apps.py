from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = _("Conversations")

    # No ready(): nothing registers at start-up (the layers below name what they ask of
    # this app in settings: agentloop.core.plugins). conversations.schema (the OpenAPI auth
    # scheme, and DRF's DEFAULT_SCHEMA_CLASS) is not imported here either: DRF imports it
    # when a schema is generated.
