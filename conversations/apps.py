from types import SimpleNamespace

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


def _conversation_for_key(key, conversation_id):
    # The API package imports DRF and drf_spectacular: a worker that never asks does not
    # pay for them at start-up (a third of it).
    from conversations.api import conversation_for_key

    return conversation_for_key(key, conversation_id)


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = _("Conversations")

    # conversations.schema (the OpenAPI auth scheme, and DRF's DEFAULT_SCHEMA_CLASS) is not
    # imported here: DRF imports it when a schema is generated.
    def ready(self):
        # Imported here, not at the top: these modules import models, which the app
        # registry cannot give before it is ready.
        from agentloop.core import redaction
        from conversations import handoff, languages, notes, platforms, routing
        from delivery import hooks as delivery_hooks
        from tools import hooks as tools_hooks

        # The layers below ask conversations through these (the order: .importlinter).
        redaction.register_platforms(platforms)
        delivery_hooks.register_platforms(platforms)
        delivery_hooks.register_languages(languages.of)
        tools_hooks.register(conversations=SimpleNamespace(
            inform=notes.inform, conversation_for_key=_conversation_for_key, take_over=handoff.take_over,
            hand_to_agent=routing.hand_over_for_tool))
