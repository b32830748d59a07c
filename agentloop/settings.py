"""agentloop settings: one file, every knob read from the environment (or `.env`).

Every variable is documented in agentloop/config_table.py (docs/configuration.md is
generated from it; tests/unit/test_config_docs.py fails when a read here is missing there);
bad values fail loudly at start-up (django-environ raises on a malformed int, float,
bool or URL).
"""

import os
import socket
import sys
from pathlib import Path

import environ

from agentloop import wiring
from agentloop.core import metrics_dir
from agentloop.core.process_apps import installed_apps
from agentloop.core.proxies import trusted_networks
from agentloop.core.secret_file import MISSING_SECRET_KEY, read_or_create_secret_key
from agentloop.logging_config import logging_config

# Django's and its apps' own settings, written in agentloop/wiring.py; the rest: wiring.<NAME>.
from agentloop.wiring import MIDDLEWARE, SPECTACULAR_SETTINGS, TEMPLATES, UNFOLD  # noqa: F401

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
# Required, the same on every host (one made up per host signs sessions the others refuse).
# `make run` (AGENTLOOP_LOCAL_SECRET_KEY=true), DEBUG and the tests write one to var/secret_key.
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not (DEBUG or env.bool("AGENTLOOP_LOCAL_SECRET_KEY", default=False) or "pytest" in sys.modules
            or (VAR_DIR / "secret_key").exists()):
        raise environ.ImproperlyConfigured(MISSING_SECRET_KEY)
    SECRET_KEY = read_or_create_secret_key(VAR_DIR / "secret_key")

# `make run` binds HOST; a non-loopback HOST is allowed as a Host header too. The test
# client's `testserver` is added by the test runner, not here.
ALLOWED_HOSTS = env.list(
    "ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", env.str("HOST", default="127.0.0.1")]
)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# --- HTTPS (production behind a TLS-terminating proxy) -------------------------------
# Off by default: `make run` serves plain HTTP on loopback. HTTPS=true turns every
# switch on (what `manage.py check --deploy` asks for); each can still be set alone.
HTTPS = env.bool("HTTPS", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=HTTPS)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # the load balancer's probe speaks plain HTTP
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=HTTPS)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=HTTPS)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=HTTPS)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=HTTPS)
# Only behind a proxy that sets this header itself (and drops a client's): e.g.
# SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https
SECURE_PROXY_SSL_HEADER = env.tuple("SECURE_PROXY_SSL_HEADER", default=None)
# The proxies whose X-Forwarded-For the web server believes (addresses or networks,
# 10.0.0.5,10.1.0.0/16): a request from one of them is the client's that header names (the
# last address in it that is not a trusted proxy), so the admin's login lockout and the
# access log see each client, not the proxy. Empty: no forwarded header is believed.
AGENTLOOP_TRUSTED_PROXIES = trusted_networks(env.list("AGENTLOOP_TRUSTED_PROXIES", default=[]))

INSTALLED_APPS = installed_apps(sys.argv, [  # as this process runs them (daphne, the admin): core/process_apps.py
    # The admin's theme (django-unfold, docs/console.md): before the admin, whose templates it overrides.
    "unfold",
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
    "agentloop.core",  # app label `agentloop` (its tables and migrations kept that name)
    "axes",  # admin login throttling (below)
    # Last: its admin module dresses the other apps' admins (auth, axes, django-q) in the theme.
    "agentloop.console",
])

# Benchmarks mount a bare reference view beside the product (tests/bench/urls.py).
ROOT_URLCONF = env.str("AGENTLOOP_URLCONF", default="agentloop.urls")
ASGI_APPLICATION = "agentloop.asgi.application"
WSGI_APPLICATION = "agentloop.wsgi.application"

# --- Database -------------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'agentloop.sqlite3'}")
}
# DATABASE_POOL: PostgreSQL only (see below); SQLite ignores it, as it does CONN_MAX_AGE.
DATABASE_POOL = env.bool("DATABASE_POOL", default=False)
# DATABASE_URL goes through a transaction-mode pooler (PgBouncer pool_mode=transaction).
DATABASE_TRANSACTION_POOLER = env.bool("DATABASE_TRANSACTION_POOLER", default=False)
# Tests: each pytest process its own test database (dropped at its end), so that two runs
# on one checkout, a quick loop beside `make test`, never drop or rebuild each other's.
_RUN = f"_{os.getpid()}" if "PYTEST_VERSION" in os.environ else ""
if DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3" and _RUN:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}{_RUN}"}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(exist_ok=True)
    # Django's SQLite backend plus an in-process queue for write transactions.
    DATABASES["default"]["ENGINE"] = "agentloop.core.sqlite"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # Writers queue for the lock instead of failing with "database is locked":
            # BEGIN IMMEDIATE takes the write lock up front, WAL lets readers go on.
            "transaction_mode": "IMMEDIATE",
            "timeout": env.float("SQLITE_TIMEOUT", default=30.0),
            # secure_delete: a deleted row's bytes are overwritten, not left in free pages
            # that a backup copies as they are (an erased person's texts among them).
            # Debian's SQLite has it on by default, so it costs what was measured; other
            # builds leave it off.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA secure_delete=ON;",
        }
    )
    # A file (not :memory:) so that the worker and server processes that the
    # end-to-end tests start can open the test database too.
    DATABASES["default"]["TEST"] = {"NAME": env.str("SQLITE_TEST_NAME", default=str(VAR_DIR / f"test_agentloop{_RUN}.sqlite3"))}
else:
    # DATABASE_POOL: Django's psycopg pool (a process keeps up to DATABASE_POOL_MAX_SIZE
    # connections open and lends one to each request or thread) instead of a connection
    # per request. A pooled connection is never "persistent": CONN_MAX_AGE must stay 0
    # (Django refuses both), so setting CONN_MAX_AGE as well is refused here, by name.
    if DATABASE_POOL:
        if env.int("CONN_MAX_AGE", default=0) != 0:
            raise environ.ImproperlyConfigured(
                "DATABASE_POOL=true keeps connections in a pool: leave CONN_MAX_AGE unset (or 0)")
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env.int("DATABASE_POOL_MIN_SIZE", default=2),
            # A worker keeps one connection per database thread (about 4 + AGENTLOOP_TOOL_THREADS).
            "max_size": env.int("DATABASE_POOL_MAX_SIZE", default=32),
            # Waiting for a free connection longer than this fails the step like an outage.
            "timeout": env.float("DATABASE_POOL_TIMEOUT", default=10.0),
        }
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))
    # A database host that drops packets (a failed-over primary cut off) must not hang a
    # reconnect or a query: a connect deadline, keepalives (an idle socket's dead peer seen in
    # ~20 s, not two hours) and a TCP user timeout (a query sent and never acknowledged).
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "connect_timeout": env.int("DATABASE_CONNECT_TIMEOUT", default=5), "keepalives": 1,
        "keepalives_idle": env.int("DATABASE_KEEPALIVES_IDLE", default=10), "keepalives_interval": 5,
        "keepalives_count": 2, "tcp_user_timeout": 1000 * env.int("DATABASE_TCP_USER_TIMEOUT", default=10)})
    # DATABASE_TRANSACTION_POOLER: DATABASE_URL goes through a transaction-mode pooler
    # (PgBouncer pool_mode=transaction), where each transaction may run on another server
    # session. A server-side cursor (QuerySet.iterator() outside a transaction, e.g. in a
    # data migration) would be fetched from on a session that never declared it, so
    # Django's are turned off: such querysets are read whole instead.
    if DATABASE_TRANSACTION_POOLER:
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    # DATABASE_PREPARED_STATEMENTS: parameters bound on the server and a statement run a
    # fifth time on a connection prepared there (psycopg's prepare_threshold), so the
    # server stops parsing and planning the same few statements thousands of times a
    # second. Off by default behind a transaction pooler, whose server sessions change
    # under a connection (PgBouncer 1.21+ with max_prepared_statements copes: set it on).
    if env.bool("DATABASE_PREPARED_STATEMENTS", default=not DATABASE_TRANSACTION_POOLER):
        DATABASES["default"]["OPTIONS"].update({"server_side_binding": True, "prepare_threshold": 5})
# A reused connection is checked before a request or task uses it: after a database
# restart the dead one is replaced instead of failing the first query.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("CONN_HEALTH_CHECKS", default=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [{"NAME": f"django.contrib.auth.password_validation.{name}"} for name in (
    "UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator")]
# Admin logins (django-axes): N failures in a row lock a username out from an address; a success resets.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("AGENTLOOP_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AGENTLOOP_LOGIN_LOCKOUT_MINUTES", default=15.0) / 60  # hours
AXES_LOCKOUT_PARAMETERS, AXES_RESET_ON_SUCCESS = [["username", "ip_address"]], True

# Texts to users: the contact's platform language, else the channel's, else this one
# (agentloop.core.languages); the admin and the console: the browser's (LocaleMiddleware).
LANGUAGE_CODE = env.str("AGENTLOOP_LANGUAGE", default="en")
LANGUAGES = [("en", "English"), ("es", "Español"), ("pt", "Português")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# daphne serves /static/ itself (agentloop/asgi.py) unless a front proxy does it.
AGENTLOOP_SERVE_STATIC = env.bool("AGENTLOOP_SERVE_STATIC", default=True)

# Webhook and API bodies: Telegram updates are a few KB; anything far larger is refused (413),
# by the web server before it is read further (agentloop/core/body_limit.py), chunked or not.
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
    "DEFAULT_SCHEMA_CLASS": "conversations.schema.ApiSchema",
    # JSON in, JSON out: what the schema documents (a form body is refused with 415).
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env.str("AGENTLOOP_API_RATE", default="6000/min")},
    "EXCEPTION_HANDLER": "agentloop.core.api.json_exception_handler",
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
# How long the worker loop may sleep when it knows of no nearer deadline (known ones are
# slept to exactly); once idle for half a second, its looks for other processes' ready turns
# and due replies slow to the second (agentloop.core.backoff.IdlePoll; config_table.py).
AGENTLOOP_POLL_INTERVAL = env.float("AGENTLOOP_POLL_INTERVAL", default=0.05)
AGENTLOOP_IDLE_POLL_INTERVAL = env.float("AGENTLOOP_IDLE_POLL_INTERVAL", default=0.25)
AGENTLOOP_MAX_CONCURRENT_TURNS = env.int("AGENTLOOP_MAX_CONCURRENT_TURNS", default=1000)
# Seconds between typing indicators; 0: each platform's own (Telegram 4 s, below its ~5 s).
AGENTLOOP_TYPING_INTERVAL = env.float("AGENTLOOP_TYPING_INTERVAL", default=0.0)
# Typing loops one worker runs at once; beyond it a conversation shows no indicator.
AGENTLOOP_MAX_TYPING = env.int("AGENTLOOP_MAX_TYPING", default=1000)
AGENTLOOP_PREVIEW_INTERVAL = env.float("AGENTLOOP_PREVIEW_INTERVAL", default=1.0)
AGENTLOOP_STREAM_SAVE_INTERVAL = env.float("AGENTLOOP_STREAM_SAVE_INTERVAL", default=1.0)
# Input without end: a turn's merged text is cut to this many characters (the cut is
# marked; the stored messages keep everything), and a conversation holds at most this
# many messages waiting for a turn — later ones are stored and answered with a notice.
AGENTLOOP_MAX_TURN_CHARS = env.int("AGENTLOOP_MAX_TURN_CHARS", default=16000)
AGENTLOOP_MAX_PENDING_MESSAGES = env.int("AGENTLOOP_MAX_PENDING_MESSAGES", default=200)
# Groups: what the group said, not addressed to the agent, given to the next turn that is.
AGENTLOOP_GROUP_CONTEXT_MESSAGES = env.int("AGENTLOOP_GROUP_CONTEXT_MESSAGES", default=20)
# Scheduled messages (conversations.schedules): how many due ones a worker sends per round.
AGENTLOOP_SCHEDULE_BATCH = env.int("AGENTLOOP_SCHEDULE_BATCH", default=200)

# --- Files users send (conversations/media) ---------------------------------------
# Stored through Django's default storage: the filesystem under MEDIA_ROOT, or an
# S3-compatible bucket (django-storages) when AGENTLOOP_S3_BUCKET names one — so that
# several hosts share the files their workers fetch and their web servers serve.
MEDIA_ROOT = env.path("AGENTLOOP_MEDIA_ROOT", default=VAR_DIR / "files")
AGENTLOOP_S3_BUCKET = env.str("AGENTLOOP_S3_BUCKET", default="")
if AGENTLOOP_S3_BUCKET:
    STORAGES = wiring.s3_storages(
        AGENTLOOP_S3_BUCKET, endpoint_url=env.str("AGENTLOOP_S3_ENDPOINT_URL", default=""),
        region_name=env.str("AGENTLOOP_S3_REGION", default=""),
        # Empty: boto3's own chain (AWS_ACCESS_KEY_ID…, an instance role).
        access_key=env.str("AGENTLOOP_S3_ACCESS_KEY_ID", default=""),
        secret_key=env.str("AGENTLOOP_S3_SECRET_ACCESS_KEY", default=""),
        location=env.str("AGENTLOOP_S3_PREFIX", default=""))
# One file at most (Telegram's Bot API serves bots files up to 20 MB); larger ones are
# described to the model, not fetched. A burst's images shown to a model, in all.
AGENTLOOP_MEDIA_MAX_BYTES = env.int("AGENTLOOP_MEDIA_MAX_BYTES", default=20_000_000)
# The body of a request that carries a file (views marked `accepts_upload`: an API message
# with its file, the playground's attachment): the file at its largest, and a form around
# it as large as any other body may be. Every other body: AGENTLOOP_MAX_BODY_BYTES.
AGENTLOOP_MAX_UPLOAD_BODY_BYTES = AGENTLOOP_MEDIA_MAX_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE
AGENTLOOP_MEDIA_MAX_TURN_BYTES = env.int("AGENTLOOP_MEDIA_MAX_TURN_BYTES", default=50_000_000)
# One fetch, overall (a platform that trickles bytes meets it); tries before giving up.
AGENTLOOP_MEDIA_FETCH_DEADLINE = env.float("AGENTLOOP_MEDIA_FETCH_DEADLINE", default=30.0)
AGENTLOOP_MEDIA_ATTEMPTS = env.int("AGENTLOOP_MEDIA_ATTEMPTS", default=4)
# How long a turn waits for its files before the agent runs without those still missing.
AGENTLOOP_MEDIA_WAIT = env.float("AGENTLOOP_MEDIA_WAIT", default=30.0)
# Seconds between a worker's looks for files to fetch while their window is open.
AGENTLOOP_MEDIA_POLL = env.float("AGENTLOOP_MEDIA_POLL", default=0.5)
# Images larger than this many pixels on their longer side are downscaled for the model.
AGENTLOOP_MEDIA_IMAGE_MAX_SIDE = env.int("AGENTLOOP_MEDIA_IMAGE_MAX_SIDE", default=1568)
# Images that would take more pixels than this to decode are not decoded (shown to no
# model, no thumbnail): a few KB of PNG can say 13,000 x 13,000 (conversations.media.images).
AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS = env.int("AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS", default=40_000_000)
# How long a signed link to a file (webhook and pull agents' `media`) works, seconds.
AGENTLOOP_MEDIA_URL_TTL = env.int("AGENTLOOP_MEDIA_URL_TTL", default=3600)
# Files given by https URL (the API's media_url) are checked against the public CAs and
# also those in this PEM bundle (an internal CA; the tests' self-signed certificate).
AGENTLOOP_MEDIA_URL_CA_BUNDLE = env.str("AGENTLOOP_MEDIA_URL_CA_BUNDLE", default="")
# Voice notes and audio as text: an OpenAI-compatible /v1/audio/transcriptions (empty: not
# transcribed, unless a channel's agent_config["transcription"] names a server).
AGENTLOOP_TRANSCRIPTION_BASE_URL = env.str("AGENTLOOP_TRANSCRIPTION_BASE_URL", default="")
AGENTLOOP_TRANSCRIPTION_MODEL = env.str("AGENTLOOP_TRANSCRIPTION_MODEL", default="whisper-1")
AGENTLOOP_TRANSCRIPTION_API_KEY_ENV = env.str("AGENTLOOP_TRANSCRIPTION_API_KEY_ENV", default="OPENAI_API_KEY")
AGENTLOOP_TRANSCRIPTION_TIMEOUT = env.float("AGENTLOOP_TRANSCRIPTION_TIMEOUT", default=60.0)
# Distinct guard-only action names one agent key may use (/api/v1/actions/claim).
AGENTLOOP_MAX_ACTIONS_PER_KEY = env.int("AGENTLOOP_MAX_ACTIONS_PER_KEY", default=100)
# A worker whose heartbeat is older than this is dead: its turns are recovered.
AGENTLOOP_WORKER_STALE_AFTER = env.float("AGENTLOOP_WORKER_STALE_AFTER", default=30.0)
# How workers tell that another worker died (conversations/liveness.py). advisory
# (PostgreSQL's default): each worker holds a session advisory lock on a connection of
# its own; its lock frees when its process dies or its host drops off the network, and
# the others take over within seconds. heartbeat (SQLite's only choice): a worker is dead
# when its heartbeat is older than AGENTLOOP_WORKER_STALE_AFTER.
AGENTLOOP_LIVENESS = env.str(
    "AGENTLOOP_LIVENESS",
    default="heartbeat" if DATABASES["default"]["ENGINE"] == "agentloop.core.sqlite" else "advisory")
if AGENTLOOP_LIVENESS not in ("advisory", "heartbeat"):
    raise environ.ImproperlyConfigured("AGENTLOOP_LIVENESS must be advisory or heartbeat")
if AGENTLOOP_LIVENESS == "advisory" and DATABASES["default"]["ENGINE"] == "agentloop.core.sqlite":
    raise environ.ImproperlyConfigured("AGENTLOOP_LIVENESS=advisory needs PostgreSQL (SQLite: heartbeat)")
# The lock's connection, when DATABASE_URL goes through a transaction-mode pooler
# (PgBouncer): a session lock must be held by a session of its own, so point this at
# PostgreSQL itself or at a session-mode pool. Empty: DATABASE_URL.
AGENTLOOP_LIVENESS_DATABASE_URL = env.str("AGENTLOOP_LIVENESS_DATABASE_URL", default="")
# Seconds after which a silent peer is given up on that connection, on both ends (TCP
# keepalives and tcp_user_timeout): a host that vanished loses its lock in about this.
AGENTLOOP_LIVENESS_TIMEOUT = env.int("AGENTLOOP_LIVENESS_TIMEOUT", default=3)
# The host name workers put in their owner stamps and heartbeats. Workers with the same
# name judge each other's pids from /proc at once: processes that share a host name but
# not a pid space (containers on the host's network) need a name each. Tests give a
# worker a foreign name to play one on another host.
AGENTLOOP_HOSTNAME = env.str("AGENTLOOP_HOSTNAME", default="") or socket.gethostname()
# An agent's whole answer (every model request and tool call of one turn) must come
# within this many seconds, or the turn fails with an apology; a channel's agent config
# may set its own `deadline`.
AGENTLOOP_AGENT_DEADLINE = env.float("AGENTLOOP_AGENT_DEADLINE", default=300.0)
# A webhook agent's answer is read up to this many bytes, then refused (the turn fails).
AGENTLOOP_AGENT_MAX_ANSWER_BYTES = env.int("AGENTLOOP_AGENT_MAX_ANSWER_BYTES", default=30_000_000)
AGENTLOOP_TELEGRAM_POLL_TIMEOUT = env.int("AGENTLOOP_TELEGRAM_POLL_TIMEOUT", default=25)
# Connections per bot for replies (typing indicators get as many again, apart).
AGENTLOOP_TELEGRAM_CONNECTIONS = env.int("AGENTLOOP_TELEGRAM_CONNECTIONS", default=8)
# A reply's wait for one of those connections, and for Telegram's answer once it went out.
# A send still waiting for a connection is not sent (resent unlabelled); one that went out
# and got no answer in time may have arrived (resent labelled). The wait is long: a boot
# sweep hands thousands of rows to 8 connections at once (10,000 queued took ~10 s), and
# giving up on the queue only sends them again later.
AGENTLOOP_TELEGRAM_POOL_TIMEOUT = env.float("AGENTLOOP_TELEGRAM_POOL_TIMEOUT", default=30.0)
AGENTLOOP_TELEGRAM_READ_TIMEOUT = env.float("AGENTLOOP_TELEGRAM_READ_TIMEOUT", default=5.0)
# The platforms channels speak and the agents that answer them (agentloop/wiring.py), each
# with `kind=dotted.path,…` of your own added; what the layers below ask of those above.
AGENTLOOP_PLATFORMS = {**wiring.PLATFORMS, **dict(p.split("=", 1) for p in env.list("AGENTLOOP_EXTRA_PLATFORMS", default=[]) if "=" in p)}
AGENTLOOP_AGENTS = {**wiring.AGENTS, **dict(p.split("=", 1) for p in env.list("AGENTLOOP_EXTRA_AGENTS", default=[]) if "=" in p)}
AGENTLOOP_SECRET_SOURCES, AGENTLOOP_QUESTION_BUTTONS = wiring.SECRET_SOURCES, wiring.QUESTION_BUTTONS
AGENTLOOP_CONVERSATION_SIDE, AGENTLOOP_TOOL_SOURCES = wiring.CONVERSATION_SIDE, wiring.TOOL_SOURCES

# A turn handed to an external agent (pull, or a webhook agent answering later) that is
# not finished within this time is released to be taken again.
AGENTLOOP_EXTERNAL_TURN_TIMEOUT = env.float("AGENTLOOP_EXTERNAL_TURN_TIMEOUT", default=300.0)
# ...at most this many times (claims, worker starts included): then it fails and the user is told.
AGENTLOOP_EXTERNAL_TURN_ATTEMPTS = env.int("AGENTLOOP_EXTERNAL_TURN_ATTEMPTS", default=3)
# Environment variables an agent's `api_key_env` may name, besides any *_API_KEY: the
# key is sent to the URL the channel's operator chose, so never SECRET_KEY or DATABASE_URL.
AGENTLOOP_AGENT_KEY_ENVS = env.list("AGENTLOOP_AGENT_KEY_ENVS", default=[])

# --- the delivery ledger (Layer 3) ---------------------------------------------------
# Off: replies are sent straight from memory, once; a crash loses those in flight.
AGENTLOOP_DELIVERY_LEDGER = env.bool("AGENTLOOP_DELIVERY_LEDGER", default=True)
# A row held in `attempting` longer than this is orphaned, whoever holds it.
AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT = env.float("AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT", default=300.0)
# An api channel's callback POST, from connect to the last byte of the answer (seconds).
AGENTLOOP_CALLBACK_TIMEOUT = env.float("AGENTLOOP_CALLBACK_TIMEOUT", default=10.0)
# Long-polls of the conversation read API waiting at once, per web process (503 beyond).
AGENTLOOP_MAX_LONG_POLLS = env.int("AGENTLOOP_MAX_LONG_POLLS", default=200)
# The read API's SSE streams (conversations/api/streaming.py): open at once per agent key
# and web process (429 beyond), and seconds between two keep-alive comments.
AGENTLOOP_MAX_STREAMS_PER_KEY = env.int("AGENTLOOP_MAX_STREAMS_PER_KEY", default=4)
AGENTLOOP_SSE_HEARTBEAT = env.float("AGENTLOOP_SSE_HEARTBEAT", default=15.0)
# The django-q2 safety sweep stops claiming after this long (seconds; under the task timeout).
AGENTLOOP_SAFETY_SWEEP_BUDGET = env.float("AGENTLOOP_SAFETY_SWEEP_BUDGET", default=40.0)

# --- retention (conversations/retention.py; docs/operations.md#retention) --------------
# Days each kind of data is kept; the sweep (django-q2, every 10 minutes) deletes older
# rows in batches and never what a guarantee still needs (an open buffer, an active turn,
# an open ledger row, a claim inside its window, a conversation's last 20 turns).
AGENTLOOP_RETAIN_MESSAGES_DAYS = env.float("AGENTLOOP_RETAIN_MESSAGES_DAYS", default=30.0)
AGENTLOOP_RETAIN_LEDGER_DAYS = env.float("AGENTLOOP_RETAIN_LEDGER_DAYS", default=7.0)
AGENTLOOP_RETAIN_CLAIMS_DAYS = env.float("AGENTLOOP_RETAIN_CLAIMS_DAYS", default=30.0)
AGENTLOOP_RETAIN_AUDIT_DAYS = env.float("AGENTLOOP_RETAIN_AUDIT_DAYS", default=365.0)
# Sent or cancelled scheduled messages (after their last tick), unreachable chats' marks
# (after the last refused send): both hold a person's text or chat id.
AGENTLOOP_RETAIN_SCHEDULES_DAYS = env.float("AGENTLOOP_RETAIN_SCHEDULES_DAYS", default=30.0)
AGENTLOOP_RETAIN_UNREACHABLE_DAYS = env.float("AGENTLOOP_RETAIN_UNREACHABLE_DAYS", default=30.0)
# Rows per delete transaction. SQLite has one writer: a batch of 500 held the write lock
# ~0.15 s (when rows were loaded to be deleted) and raised the p99 admission latency 6x
# during a sweep; 100 rows now hold it ~1 ms (tests/bench/retention.py). PostgreSQL
# locks only the rows.
AGENTLOOP_RETENTION_BATCH = env.int("AGENTLOOP_RETENTION_BATCH", default=100 if DATABASES["default"][
    "ENGINE"] == "agentloop.core.sqlite" else 500)
AGENTLOOP_RETENTION_SWEEP_BUDGET = env.float("AGENTLOOP_RETENTION_SWEEP_BUDGET", default=40.0)

# --- the action guard and its tools (Layer 2) -------------------------------------------
AGENTLOOP_TOOLS = [*wiring.TOOLS, *env.list("AGENTLOOP_EXTRA_TOOLS", default=[])]  # agentloop/wiring.py
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

# --- Prometheus metrics (GET /metrics: agentloop/core/metrics.py, docs/metrics.md) -------
# Read with a staff login (the view_metrics permission) or `Authorization: Bearer <this>`.
AGENTLOOP_METRICS_TOKEN = env.str("AGENTLOOP_METRICS_TOKEN", default="")
# The product's processes on this host share their figures through this directory
# (prometheus-client's multiprocess mode; prepared and cleaned at start: core/metrics_dir.py).
AGENTLOOP_PROCESS = metrics_dir.process_kind(sys.argv)
AGENTLOOP_METRICS_DIR = metrics_dir.use(
    env.path("AGENTLOOP_METRICS_DIR", default=VAR_DIR / "metrics") if AGENTLOOP_PROCESS else None)

# --- OpenTelemetry traces (agentloop/core/tracing.py, docs/metrics.md#traces) ----------
# auto: on when OTEL_EXPORTER_OTLP_ENDPOINT (or …_TRACES_ENDPOINT) names a collector;
# true: on (OTLP/HTTP's default endpoint if none is named); false: off. The OTEL_*
# variables themselves are read by OpenTelemetry's SDK and exporter.
AGENTLOOP_TRACING = env.str("AGENTLOOP_TRACING", default="auto").strip().lower()
if AGENTLOOP_TRACING not in ("auto", "true", "false"):
    raise environ.ImproperlyConfigured(f"AGENTLOOP_TRACING must be auto, true or false, not {AGENTLOOP_TRACING!r}")

LOGGING = logging_config(env.str("LOG_LEVEL", default="INFO"), env.str("DJANGO_Q_LOG_LEVEL", default="WARNING"))
