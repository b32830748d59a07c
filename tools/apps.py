from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = _("Tools and the action guard")

    def ready(self):
        # Imported here, not at the top: these modules import models, which the app
        # registry cannot give before it is ready.
        from delivery import hooks as delivery_hooks
        from tools import approvals, confirmations, hooks, registry
        from tools.mcp import catalog

        # Calls against the layer order, registered (the order: .importlinter; tools.hooks).
        hooks.register(approvals=approvals, confirmations=confirmations)
        # The ledger sends a question with its answer buttons.
        delivery_hooks.register_buttons(confirmations.buttons_for_rows)
        # MCP servers' tools, by the names they are offered as (tools.mcp).
        registry.add_source(catalog.tool)
