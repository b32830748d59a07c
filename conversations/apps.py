from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"

    def ready(self):
        from conversations import schema  # noqa: F401  registers the OpenAPI auth scheme
