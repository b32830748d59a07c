"""The settings that read no environment: the middleware chain, the template engine, the
API schema's settings and the registries of platforms, agents and tools. agentloop/settings.py imports them; everything read from the
environment stays there (tests/unit/test_config_docs.py parses that file)."""

from pathlib import Path

from django.templatetags.static import static
from django.urls import reverse_lazy
from django.utils.translation import gettext_lazy as _

BASE_DIR = Path(__file__).resolve().parent.parent

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The admin and the console in the operator's browser language (Accept-Language).
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Innermost, so its process_exception sees a view's database outage first: 503.
    "agentloop.core.middleware.DatabaseUnavailableMiddleware",
    "axes.middleware.AxesMiddleware",  # a locked-out login answers 429
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The API docs' text (the schema's `info.description`, Markdown): what the API is, and
# /mcp, which the schema cannot list as a path (it is not a REST operation but a JSON-RPC
# endpoint mounted beside Django: tools/mcp/endpoint.py).
API_DESCRIPTION = """\
Inbound messages, reading a conversation and its replies, tools behind the action guard,
external agents' turns, scheduled messages, a person taking a conversation over. Every
operation takes `Authorization: Bearer <agent key>` (the operators' take a staff login);
the operations are grouped by what a client does, in the order it usually does it.

## MCP: `/mcp`

The same hosted tools and the action guard are served to MCP clients at `/mcp` (every
channel of the key) and `/mcp/<channel>` (one of them; 403 if the key does not hold it).
It speaks the Model Context Protocol: JSON-RPC 2.0 over **Streamable HTTP** (stateless,
JSON answers; POST one JSON-RPC message, `Accept: application/json, text/event-stream`),
with the same agent keys (`Authorization: Bearer <agent key>`; 401 without a valid one)
and the same rate limit and body limit as the REST API. Its tools: the hosted tools
(each call exactly `POST /api/v1/tools/{name}/invoke`) and `guard_claim`, `guard_succeed`,
`guard_fail` (exactly `POST /api/v1/actions/claim`, `…/{claim}/succeed`, `…/{claim}/fail`).
See docs/mcp.md.
"""

# The groups of the docs page, in this order (conversations.schema tags each operation by its
# path and orders the paths so).
API_TAGS = [
    {"name": "inbound", "description": "A person's message into an API channel: sent, edited, deleted. "
                                       "Deduplicated by `message_id` and buffered into one turn per burst."},
    {"name": "reading", "description": "A conversation's messages and replies, page by page or waiting for "
                                       "the next one (long poll); the audit trail's events, for monitoring."},
    {"name": "replies", "description": "A reply as it is being written (Server-Sent Events), for a client "
                                       "that shows it live."},
    {"name": "tools and the guard", "description": "The hosted tools, each call behind the action guard, and "
                                                   "the guard for an agent's own actions: claim, then succeed "
                                                   "or fail. Also over MCP at `/mcp` (see above)."},
    {"name": "turns", "description": "An external agent's work: the turns ready for it, claimed, answered "
                                     "and marked done."},
    {"name": "schedules", "description": "A message that goes out by itself later, once or repeated."},
    {"name": "takeover", "description": "A person in the conversation (a helpdesk): take it over, reply as "
                                        "that person, give it back to the agent."},
    {"name": "operators", "description": "What an operator's tooling does, with a staff login (session or "
                                         "HTTP Basic), not an agent key: forget a person on request."},
]

SPECTACULAR_SETTINGS = {
    "TITLE": "agentloop API",
    "DESCRIPTION": API_DESCRIPTION,
    "VERSION": "1.0.0",
    "TAGS": API_TAGS,
    # Operations in the URLconf's order (a client's flow), then grouped by tag by the hook.
    "SORT_OPERATIONS": False,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "conversations.schema.paths_in_tag_order"],
    "SERVE_INCLUDE_SCHEMA": False,  # the schema's own URL is not an operation of the API
    # The docs page's assets come from our own static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # 3.1: JSON Schema's whole vocabulary, e.g. `propertyNames` (what an object's keys may be).
    "OAS_VERSION": "3.1.0",
}


# The platforms channels speak: kind -> Platform class (conversations/platforms/<kind>/).
PLATFORMS = {
    "api": "conversations.platforms.api.ApiPlatform", "webchat": "conversations.platforms.webchat.WebchatPlatform",
    "telegram": "conversations.platforms.telegram.TelegramPlatform",
    "whatsapp": "conversations.platforms.whatsapp.WhatsAppPlatform",
    "slack": "conversations.platforms.slack.SlackPlatform",
    "discord": "conversations.platforms.discord.DiscordPlatform",
    "matrix": "conversations.platforms.matrix.MatrixPlatform",
    "google_chat": "conversations.platforms.google_chat.GoogleChatPlatform",
    "teams": "conversations.platforms.teams.TeamsPlatform",
    "messenger": "conversations.platforms.messenger.MessengerPlatform",
    "instagram": "conversations.platforms.messenger.InstagramPlatform",
    "sms": "conversations.platforms.sms.SmsPlatform",
    "email": "conversations.platforms.email.EmailPlatform",
}
# What the layers below ask of the apps above them, by dotted path (agentloop.core.plugins;
# docs/architecture.md, "Pointing up"). The secrets stored above core, masked in every
# error text (agentloop.core.redaction): every channel's, every MCP server's.
SECRET_SOURCES = ["conversations.secrets.of_every_channel", "tools.mcp.secrets.of_every_server"]
# The answer buttons of the questions among the ledger's rows (delivery.questions).
QUESTION_BUTTONS = "tools.confirmations.buttons_for_rows"
# The agents a channel may name (settings.AGENTLOOP_AGENTS adds AGENTLOOP_EXTRA_AGENTS).
AGENTS = {
    "echo": "conversations.agents.EchoAgent",
    "demo": "conversations.demo_agent.DemoAgent",
    "openai": "conversations.openai_agent.OpenAIAgent",
    "webhook": "conversations.remote_agents.WebhookAgent",
    "pull": "conversations.remote_agents.PullAgent",
    "a2a": "conversations.a2a_agent.A2AAgent",
}
# A replay's channel (agentloop.console.replay), kept apart from the real platforms above:
# a kind whose transport records sends and makes none.
PLATFORMS["sandbox"] = "conversations.platforms.sandbox.SandboxPlatform"
# The built-in tools behind the guard (settings.AGENTLOOP_TOOLS adds AGENTLOOP_EXTRA_TOOLS).
TOOLS = [
    "tools.builtin.calendar.CreateEvent",
    "tools.builtin.calendar.ListEvents",
    "tools.builtin.calendar.DeleteEvent",
    "tools.builtin.email.SendEmail",
    "tools.builtin.reminders.CreateReminder",
    "conversations.handoff_tools.Handoff",
    "conversations.handoff_tools.HandoffToAgent",
]
# What tools asks of conversations, the app above it (tools.conversation_side): a decision
# on a proposal ends in its conversation; an API or MCP request names a conversation, an
# agent key, a channel. It points up, so tools owns the interface and this names its implementation.
CONVERSATION_SIDE = "conversations.tool_side.ConversationSide"
# Where the registry looks for a tool it does not host, in turn (tools.registry.get): the
# MCP servers' tools by the names they are offered as. The catalog builds registry Tools,
# so it is named here, as the hosted tools are, rather than imported by the registry.
TOOL_SOURCES = ["tools.mcp.catalog.tool"]


def s3_storages(bucket: str, *, endpoint_url: str, region_name: str, access_key: str, secret_key: str,
                location: str) -> dict:
    """STORAGES for an S3-compatible bucket (django-storages); empty values: the SDK's own."""
    from botocore.config import Config

    return {
        "default": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
            "bucket_name": bucket, "endpoint_url": endpoint_url or None, "region_name": region_name or None,
            "access_key": access_key or None, "secret_key": secret_key or None, "location": location,
            "default_acl": None,  # the bucket's own (private); files are served through /files/ links
            "querystring_auth": True,
            # Every call has a deadline; botocore retries (3 tries, backing off) a dropped one.
            "client_config": Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
        }},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


# The admin's theme (django-unfold): its sidebar is the navigation by what an operator does
# (agentloop.console.navigation), its first page the operations overview
# (agentloop.console.overview), a language switch in the user menu.
UNFOLD = {
    "SITE_TITLE": "agentloop",
    "SITE_HEADER": "agentloop",
    "SITE_SUBHEADER": _("Operations"),
    "SITE_URL": reverse_lazy("console-dashboard"),
    "SITE_ICON": lambda request: static("favicon.svg"),
    # On every page, the login's included (unfold's index and login skip admin/base_site.html);
    # a phone's home-screen icon too.
    "SITE_FAVICONS": [{"rel": "icon", "type": "image/svg+xml", "href": lambda request: static("favicon.svg")},
                      {"rel": "apple-touch-icon", "sizes": "180x180",
                       "href": lambda request: static("apple-touch-icon.png")}],
    # The product's colour (its icon's), one step darker at each weight than the Tailwind
    # cyan it is taken from: white on a primary-600 button reads at 5.4:1 (WCAG AA).
    "COLORS": {"primary": {"50": "#ecfeff", "100": "#a5f3fc", "200": "#67e8f9", "300": "#22d3ee", "400": "#06b6d4",
                           "500": "#0891b2", "600": "#0e7490", "700": "#155e75", "800": "#164e63", "900": "#083344",
                           "950": "#042f3a"}},
    "SHOW_LANGUAGES": True,
    "STYLES": [lambda request: static("admin/agentloop.css")],
    "SHOW_VIEW_ON_SITE": True,
    "DASHBOARD_CALLBACK": "agentloop.console.overview.dashboard_callback",
    "SIDEBAR": {
        "show_search": True,
        "show_all_applications": True,
        "navigation": "agentloop.console.navigation.sidebar",
    },
}
