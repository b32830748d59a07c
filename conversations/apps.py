from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"

    # conversations.schema (the OpenAPI auth scheme, and DRF's DEFAULT_SCHEMA_CLASS) is not
    # imported here: DRF imports it when a schema is generated, and importing
    # drf_spectacular at setup was a third of a worker's start-up.
