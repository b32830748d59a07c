"""agentloop settings: one file, every knob read from the environment (or `.env`).

Every variable is documented in README.md; bad values fail loudly at start-up
(django-environ raises on a malformed int, float, bool or URL).
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG and env.bool("AGENTLOOP_REQUIRE_SECRET_KEY", default=False):
        raise environ.ImproperlyConfigured("SECRET_KEY must be set in production")
    # A stable per-checkout key so sessions survive restarts of `make run`.
    _key_file = VAR_DIR / "secret_key"
    if _key_file.exists():
        SECRET_KEY = _key_file.read_text().strip()
    else:
        from django.core.management.utils import get_random_secret_key

        VAR_DIR.mkdir(exist_ok=True)
        SECRET_KEY = get_random_secret_key()
        _key_file.write_text(SECRET_KEY)

# `make run` binds HOST; a non-loopback HOST is allowed as a Host header too.
ALLOWED_HOSTS = env.list(
    "ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver", env.str("HOST", default="127.0.0.1")]
)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "channels",
    "conversations",
    "delivery",
    "tools",
    "audit",
    "agentloop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Benchmarks mount a bare reference view beside the product (tests/bench/urls.py).
ROOT_URLCONF = env.str("AGENTLOOP_URLCONF", default="agentloop.urls")
ASGI_APPLICATION = "agentloop.asgi.application"
WSGI_APPLICATION = "agentloop.wsgi.application"

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

# --- Database -------------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'agentloop.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(exist_ok=True)
    # Django's SQLite backend plus an in-process queue for write transactions.
    DATABASES["default"]["ENGINE"] = "agentloop.sqlite"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # Writers queue for the lock instead of failing with "database is locked":
            # BEGIN IMMEDIATE takes the write lock up front, WAL lets readers go on.
            "transaction_mode": "IMMEDIATE",
            "timeout": env.float("SQLITE_TIMEOUT", default=30.0),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file (not :memory:) so that the worker and server processes that the
    # end-to-end tests start can open the test database too.
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("SQLITE_TEST_NAME", default=str(VAR_DIR / "test_agentloop.sqlite3"))
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# daphne serves /static/ itself (agentloop/asgi.py) unless a front proxy does it.
AGENTLOOP_SERVE_STATIC = env.bool("AGENTLOOP_SERVE_STATIC", default=True)

# Webhook and API bodies: Telegram updates are a few KB; anything far larger is refused (413).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("AGENTLOOP_MAX_BODY_BYTES", default=256 * 1024)

# --- Channels (websockets; the dashboard issue builds on it) -----------------
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- REST API ---------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["conversations.api_auth.AgentKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env.str("AGENTLOOP_API_RATE", default="6000/min")},
    "EXCEPTION_HANDLER": "conversations.api_auth.json_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "agentloop API",
    "DESCRIPTION": "Inbound messages, tools behind the action guard, turns and replies.",
    "VERSION": "1.0.0",
    # The docs page's assets come from our own static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- django-q2: the safety-net sweeps (the worker loop does the timing) --------
Q_CLUSTER = {
    "name": "agentloop",
    "orm": "default",
    "workers": env.int("Q_WORKERS", default=1),
    "timeout": 60,
    "retry": 120,
    "poll": 1,
    "catch_up": False,
    "save_limit": 200,
    "label": "Background tasks",
}

# --- agentloop ---------------------------------------------------------------
# How long the worker loop may sleep when it knows of no nearer deadline. New
# immediate work (media flushes, control replies) written by another process is
# seen within this interval; known deadlines are slept to exactly.
AGENTLOOP_POLL_INTERVAL = env.float("AGENTLOOP_POLL_INTERVAL", default=0.05)
AGENTLOOP_MAX_CONCURRENT_TURNS = env.int("AGENTLOOP_MAX_CONCURRENT_TURNS", default=1000)
AGENTLOOP_TYPING_INTERVAL = env.float("AGENTLOOP_TYPING_INTERVAL", default=4.0)
# A worker whose heartbeat is older than this is dead: its turns are recovered.
AGENTLOOP_WORKER_STALE_AFTER = env.float("AGENTLOOP_WORKER_STALE_AFTER", default=30.0)
AGENTLOOP_TELEGRAM_POLL_TIMEOUT = env.int("AGENTLOOP_TELEGRAM_POLL_TIMEOUT", default=25)
# Connections per bot for replies (typing indicators get as many again, apart).
AGENTLOOP_TELEGRAM_CONNECTIONS = env.int("AGENTLOOP_TELEGRAM_CONNECTIONS", default=8)
AGENTLOOP_AGENTS = {
    "echo": "conversations.agents.EchoAgent",
    "demo": "conversations.demo_agent.DemoAgent",
    "openai": "conversations.openai_agent.OpenAIAgent",
    "webhook": "conversations.remote_agents.WebhookAgent",
    "pull": "conversations.remote_agents.PullAgent",
    **dict(
        item.split("=", 1) for item in env.list("AGENTLOOP_EXTRA_AGENTS", default=[]) if "=" in item
    ),
}

# A turn handed to an external agent (pull, or a webhook agent answering later) that is
# not finished within this time is released to be taken again.
AGENTLOOP_EXTERNAL_TURN_TIMEOUT = env.float("AGENTLOOP_EXTERNAL_TURN_TIMEOUT", default=300.0)

# --- the delivery ledger (Layer 3) ---------------------------------------------------
# Off: replies are sent straight from memory, once; a crash loses those in flight.
AGENTLOOP_DELIVERY_LEDGER = env.bool("AGENTLOOP_DELIVERY_LEDGER", default=True)
# A row held in `attempting` longer than this is orphaned, whoever holds it.
AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT = env.float("AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT", default=300.0)

# --- the action guard and its tools (Layer 2) -------------------------------------------
AGENTLOOP_TOOLS = [
    "tools.builtin.calendar.CreateEvent",
    "tools.builtin.calendar.ListEvents",
    "tools.builtin.calendar.DeleteEvent",
    "tools.builtin.email.SendEmail",
    *env.list("AGENTLOOP_EXTRA_TOOLS", default=[]),
]
# How long an identical call waits for one in flight before answering "in progress".
AGENTLOOP_GUARD_WAIT = env.float("AGENTLOOP_GUARD_WAIT", default=3.0)
# Threads per worker process for tool calls made by agents inside turns.
AGENTLOOP_TOOL_THREADS = env.int("AGENTLOOP_TOOL_THREADS", default=16)
# Naive date-times from the model ("2026-12-01T10:00") are in this zone.
AGENTLOOP_DEFAULT_TIME_ZONE = env.str("AGENTLOOP_DEFAULT_TIME_ZONE", default=TIME_ZONE)
# local: events in our database (admin + iCalendar feed); caldav: a CalDAV server.
AGENTLOOP_CALENDAR_BACKEND = env.str("AGENTLOOP_CALENDAR_BACKEND", default="local")
AGENTLOOP_CALDAV_URL = env.str("AGENTLOOP_CALDAV_URL", default="")
AGENTLOOP_CALDAV_USERNAME = env.str("AGENTLOOP_CALDAV_USERNAME", default="")
AGENTLOOP_CALDAV_PASSWORD = env.str("AGENTLOOP_CALDAV_PASSWORD", default="")
AGENTLOOP_CALDAV_CALENDAR = env.str("AGENTLOOP_CALDAV_CALENDAR", default="agentloop")
AGENTLOOP_CALDAV_TIMEOUT = env.float("AGENTLOOP_CALDAV_TIMEOUT", default=15.0)

# Email for the email_send tool: SMTP in production (EMAIL_URL=smtp://user:pass@host:587
# or smtp+tls://…), the console under `make run` when EMAIL_URL is not set.
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="agentloop@localhost")
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=20)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},  # the openai SDK's HTTP client logs every request at INFO
        "telegram": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "django_q": {"level": "WARNING"},
    },
}
