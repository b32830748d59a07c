from types import SimpleNamespace

from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"

    def ready(self):
        # Imported here, not at the top: these modules import models, which the app
        # registry cannot give before it is ready.
        from agentloop.core import redaction
        from conversations import (
            api,
            notes,
            platforms,
            schema,  # noqa: F401  registers the OpenAPI auth scheme
        )
        from delivery import hooks as delivery_hooks
        from tools import hooks as tools_hooks

        # The layers below ask conversations through these (the order: .importlinter).
        redaction.register_platforms(platforms)
        delivery_hooks.register_platforms(platforms)
        tools_hooks.register(conversations=SimpleNamespace(
            inform=notes.inform, conversation_for_key=api.conversation_for_key))
