import os
import sys

# The web process runs the server's event loop and the lean path's admitter threads,
# each database statement a call that releases the GIL; a thread whose answer came back
# waits for the GIL up to the switch interval (5 ms by default) while the event loop
# holds it. Measured under `make run` with the peer workload on SQLite (A/B, two pairs):
# POST p99 58-60 ms at 5 ms, 46-48 ms at 0.5 ms; on PostgreSQL no difference showed
# through the run-to-run noise. The worker sets its own (runloop).
sys.setswitchinterval(0.0005)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from agentloop.console import consumers  # noqa: E402
from agentloop.core.body_limit import BodyLimit  # noqa: E402
from conversations.lean_ingest import LeanIngest  # noqa: E402
from tools.mcp.endpoint import McpMount  # noqa: E402

if settings.AGENTLOOP_SERVE_STATIC:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_app = ASGIStaticFilesHandler(django_app)

websockets = URLRouter([
    path("ws/console/dashboard/", consumers.DashboardConsumer.as_asgi()),
    path("ws/console/playground/<slug:slug>/", consumers.PlaygroundConsumer.as_asgi()),
])

# Every HTTP request's body held to its limit before any of the above reads it
# (agentloop/core/body_limit.py): Django, the lean path and /mcp alike.
application = BodyLimit(ProtocolTypeRouter({
    # The Telegram webhook's POSTs skip Django's request stack (conversations/lean_ingest.py);
    # /mcp is the MCP server (tools/mcp/endpoint.py).
    "http": McpMount(LeanIngest(django_app)),
    # The session cookie logs the websocket in; another site's page may not open one.
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(websockets)),
}))
