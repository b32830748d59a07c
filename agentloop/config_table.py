"""Every environment variable agentloop reads, in one table: the source of
docs/configuration.md (written by `scripts/config_docs.py`).

settings.py reads the environment itself (django-environ, as Django projects do); this
table documents it. `tests/unit/test_config_docs.py` keeps the two together: it parses
settings.py and fails when a variable it reads is missing here, when a row says
"settings" for a variable settings.py does not read, when a literal default in
settings.py is not the one written here, and when docs/configuration.md is not what the
generator writes now. Rows read elsewhere (`read_by`) name a variable the product's code
spells out somewhere else (`make run`'s commands, a platform's demo channel).

Imports nothing of ours: the generator loads it without Django.
"""

from __future__ import annotations

from dataclasses import dataclass

SETTINGS = "settings"
OTEL = "OpenTelemetry's SDK and OTLP exporter, when tracing is on"


@dataclass(frozen=True)
class Var:
    name: str
    default: str  # as a reader would write it: `30`, `true`, "empty", or a sentence
    meaning: str  # Markdown, one paragraph
    read_by: str = SETTINGS  # "settings", or where else it is read (for the reader)


# Groups in the order of the page; each row in the order a reader looks for it.
GROUPS: list[tuple[str, str, list[Var]]] = [
    ("Django, HTTP and security", "The web process and Django itself.", [
        Var("SECRET_KEY", "required (`make run`: generated once into `var/secret_key`, mode 0600)",
            "Django's secret key, the same on every host. Without it, and with `DEBUG` off, "
            "a process refuses to start (saying so) unless `AGENTLOOP_LOCAL_SECRET_KEY` is set "
            "or the checkout already has `var/secret_key`."),
        Var("AGENTLOOP_LOCAL_SECRET_KEY", "false",
            "Generate `SECRET_KEY` into `var/secret_key` when it is not set: the laptop path, "
            "set by `make run` (and by `DEBUG=true` and the test suite); never in production."),
        Var("DEBUG", "false",
            "Django debug mode (`make run` too: `DEBUG=true make run` asks for it, and warns "
            "loudly when `HOST` is not a loopback address)."),
        Var("ALLOWED_HOSTS", "loopback names and `HOST`", "Comma-separated host names."),
        Var("AGENTLOOP_LOGIN_FAILURE_LIMIT", "5",
            "Failed admin logins in a row after which a username is locked out from that "
            "address (django-axes; answered 429); a successful login starts the count again. "
            "Behind a proxy the address is the client's only with `AGENTLOOP_TRUSTED_PROXIES`."),
        Var("AGENTLOOP_LOGIN_LOCKOUT_MINUTES", "15",
            "How long that lockout lasts. `manage.py axes_reset` lifts every lockout at once."),
        Var("HOST", "127.0.0.1",
            "Where `make run` serves (`manage.py runall --host`); a non-loopback `HOST` is "
            "also allowed as a `Host` header."),
        Var("PORT", "8000", "The port `make run` serves on (`manage.py runall --port`).",
            read_by="`manage.py runall` (`make run`)"),
        Var("CSRF_TRUSTED_ORIGINS", "empty", "Origins allowed to post admin forms behind a proxy."),
        Var("HTTPS", "false",
            "Behind TLS: turns on the six below (SSL redirect, secure cookies, HSTS a year with "
            "subdomains and preload); each can be set alone."),
        Var("SECURE_SSL_REDIRECT", "`HTTPS`",
            "Django's switch of the same name (`/healthz` is never redirected)."),
        Var("SESSION_COOKIE_SECURE", "`HTTPS`", "Django's switch of the same name."),
        Var("CSRF_COOKIE_SECURE", "`HTTPS`", "Django's switch of the same name."),
        Var("SECURE_HSTS_SECONDS", "`31536000` with `HTTPS`, else `0`",
            "HSTS; read Django's warnings about it before you turn it on."),
        Var("SECURE_HSTS_INCLUDE_SUBDOMAINS", "`HTTPS`", "HSTS for subdomains too."),
        Var("SECURE_HSTS_PRELOAD", "`HTTPS`", "Ask browsers to preload HSTS."),
        Var("SECURE_PROXY_SSL_HEADER", "unset",
            "`HTTP_X_FORWARDED_PROTO,https` behind a proxy that sets that header itself "
            "(and drops a client's)."),
        Var("AGENTLOOP_TRUSTED_PROXIES", "empty",
            "Comma-separated addresses or networks (`10.0.0.5,10.1.0.0/16`) of the proxies in "
            "front of the web server. A request from one of them is the client's its "
            "`X-Forwarded-For` names (the last address there that is not a trusted proxy), with "
            "the scheme of its `X-Forwarded-Proto`: the login lockout, the access log and Django "
            "see each client, not the proxy. Empty: no forwarded header is believed, every "
            "client is the address that connected. A value that is not an address or network "
            "stops the start ([behind a proxy](operations.md#behind-a-proxy))."),
        Var("TIME_ZONE", "UTC", "The admin's time zone."),
        Var("AGENTLOOP_LANGUAGE", "en",
            "The deployment's language (`en`, `es`, `pt`): what agentloop writes to a user whose "
            "platform gives no language, on a channel without one of its own "
            "([languages](languages.md))."),
        Var("AGENTLOOP_SERVE_STATIC", "true",
            "The web server serves `/static/` itself; turn off behind a proxy that does."),
        Var("AGENTLOOP_MAX_BODY_BYTES", "262144 (256 KB)",
            "The largest request body: a larger one gets 413 from the web server before it is "
            "read further — a declared `Content-Length` at once, a chunked body as it passes the "
            "limit. The two routes that take a file (an API message with its file, the "
            "playground's attachment) take `AGENTLOOP_MEDIA_MAX_BYTES` more."),
        Var("AGENTLOOP_API_RATE", "6000/min", "Per-agent-key API throttle."),
        Var("AGENTLOOP_MAX_LONG_POLLS", "200",
            "Long-polls of the conversation read API waiting at once, per web process; "
            "beyond, 503 with `Retry-After: 2`."),
        Var("AGENTLOOP_MAX_STREAMS_PER_KEY", "4",
            "SSE streams of the read API (`…/stream`) open at once per agent key and web "
            "process; beyond, 429 with `Retry-After: 2`. They count as long-polls too."),
        Var("AGENTLOOP_SSE_HEARTBEAT", "15",
            "Seconds between two `: keep-alive` comments on an open SSE stream."),
        Var("AGENTLOOP_URLCONF", "agentloop.urls",
            "The root URL configuration; the benchmarks mount a reference view this way."),
        Var("REDIS_URL", "empty",
            "channels-redis: the console's live updates across processes and machines "
            "(without it they cross processes through the database)."),
    ]),
    ("make run", "Read by `make run` (`manage.py bootstrap` and `manage.py runall`), not by "
     "the running product.", [
        Var("ADMIN_PASSWORD", "generated once into `var/admin_password`",
            "The `admin` user's password under `make run`, set when the user is created (a "
            "later change made in the admin is kept; printed on that first run only).",
            read_by="`manage.py bootstrap` (`make run`)"),
        Var("TELEGRAM_BOT_TOKEN", "empty",
            "Set: `make run` adds a `telegram` channel in polling mode.",
            read_by="the Telegram platform's bootstrap (`make run`)"),
        Var("WHATSAPP_TOKEN", "empty",
            "With the three below: `make run` adds a `whatsapp` channel (demo agent) and "
            "prints its webhook URL. The permanent system-user token.",
            read_by="the WhatsApp platform's bootstrap (`make run`)"),
        Var("WHATSAPP_PHONE_NUMBER_ID", "empty", "The number's id (digits, from API Setup).",
            read_by="the WhatsApp platform's bootstrap (`make run`)"),
        Var("WHATSAPP_APP_SECRET", "empty", "The Meta app's secret (App settings → Basic).",
            read_by="the WhatsApp platform's bootstrap (`make run`)"),
        Var("WHATSAPP_VERIFY_TOKEN", "empty", "The string Meta sends back when you register the webhook.",
            read_by="the WhatsApp platform's bootstrap (`make run`)"),
        Var("SLACK_BOT_TOKEN", "empty",
            "With SLACK_SIGNING_SECRET: `make run` adds a `slack` channel (demo agent) and prints "
            "its two request URLs. The app's Bot User OAuth Token (`xoxb-…`).",
            read_by="the Slack platform's bootstrap (`make run`)"),
        Var("SLACK_SIGNING_SECRET", "empty", "The Slack app's Signing Secret (Basic Information).",
            read_by="the Slack platform's bootstrap (`make run`)"),
        Var("ACCESS_LOG", "false",
            "The web server writes a line per request (off by default: a formatted write "
            "per webhook POST), secrets in its URLs masked (feed and file tokens, "
            "`hub.verify_token=`…).",
            read_by="`manage.py runall` (`make run`)"),
    ]),
    ("Database", "SQLite by default; PostgreSQL to scale out.", [
        Var("DATABASE_URL", "`sqlite:///var/agentloop.sqlite3`",
            "Any URL django-environ understands; `postgres://user:pass@host:5432/db` to scale out."),
        Var("SQLITE_TIMEOUT", "30",
            "Seconds a SQLite writer waits for the write lock (then the web answers 503)."),
        Var("SQLITE_TEST_NAME", "`var/test_agentloop_<pid>.sqlite3`",
            "The tests' SQLite file (shared with the processes they start); by default one per "
            "pytest process."),
        Var("CONN_MAX_AGE", "0",
            "PostgreSQL: seconds a process keeps a connection between requests (`0`: one per "
            "request; not with `DATABASE_POOL`)."),
        Var("DATABASE_POOL", "false",
            "PostgreSQL: Django's psycopg pool — each process keeps connections open and "
            "lends one per request or thread (refused together with `CONN_MAX_AGE`)."),
        Var("DATABASE_POOL_MIN_SIZE", "2", "The pool's lower bound per process."),
        Var("DATABASE_POOL_MAX_SIZE", "32",
            "The pool's upper bound per process (a worker holds one per database thread: "
            "about 4 + `AGENTLOOP_TOOL_THREADS`)."),
        Var("DATABASE_POOL_TIMEOUT", "10",
            "Seconds a step waits for a free pooled connection before it fails like an outage."),
        Var("DATABASE_PREPARED_STATEMENTS", "true (false with `DATABASE_TRANSACTION_POOLER`)",
            "PostgreSQL: parameters bound on the server, and a statement a connection runs a "
            "fifth time prepared there, so the server stops parsing and planning the same "
            "statements (measured: 1.69 → 1.37 ms of server CPU per message). Behind "
            "PgBouncer 1.21+ with `max_prepared_statements` set it may be turned on. A "
            "prepared statement keeps its plan until the table's statistics change, so a "
            "worker analyzes each table every message grows once it holds more than twice "
            "the rows its statistics counted (a young table, between autovacuum's looks; "
            "logged as `statistics refreshed`)."),
        Var("DATABASE_TRANSACTION_POOLER", "false",
            "PostgreSQL: `DATABASE_URL` goes through a transaction-mode pooler (PgBouncer): "
            "Django's server-side cursors off. Point `AGENTLOOP_LIVENESS_DATABASE_URL` at "
            "PostgreSQL itself: without it (or `AGENTLOOP_LIVENESS=heartbeat`) a worker "
            "refuses to start."),
        Var("DATABASE_CONNECT_TIMEOUT", "5",
            "PostgreSQL: seconds a (re)connect may take before it fails and is retried with back-off."),
        Var("DATABASE_KEEPALIVES_IDLE", "10",
            "PostgreSQL: seconds of silence before TCP keepalives probe the server (a dead "
            "host is noticed in about this + 10 s)."),
        Var("DATABASE_TCP_USER_TIMEOUT", "10",
            "PostgreSQL: seconds a statement sent may go unacknowledged by the server's host before "
            "the connection is given up (a primary cut off in a failover; docs/scaling-out.md)."),
        Var("CONN_HEALTH_CHECKS", "true",
            "A reused connection is checked before use, so a database restart costs no failed request."),
    ]),
    ("The worker loop and liveness", "`manage.py runloop`, and how workers tell that another died.", [
        Var("AGENTLOOP_POLL_INTERVAL", "0.05",
            "Longest the worker sleeps without looking; known deadlines are slept to exactly. "
            "Also the period of the ledger's runtime sweep."),
        Var("AGENTLOOP_IDLE_POLL_INTERVAL", "0.25",
            "How often a worker that found nothing for half a second looks for ready turns and due "
            "replies written by another process (its own are handed over at once); buffers' "
            "deadlines keep the interval above."),
        Var("AGENTLOOP_MAX_CONCURRENT_TURNS", "1000", "Turns in flight per worker process."),
        Var("AGENTLOOP_TYPING_INTERVAL", "0",
            "Seconds between typing indicators; `0`: each platform's own (Telegram 4 s, its "
            "indicator lasts about 5 s; WhatsApp 20 s)."),
        Var("AGENTLOOP_PREVIEW_INTERVAL", "1",
            "Seconds between two previews of a streamed reply in one chat (a Telegram draft or "
            "an edit of a group's preview message; docs/streaming.md). The first goes at once."),
        Var("AGENTLOOP_STREAM_SAVE_INTERVAL", "1",
            "Seconds between two saves of a streamed reply's text, once its turn fired an "
            "effect (a crash then sends what was saved, marked as interrupted)."),
        Var("AGENTLOOP_MAX_TYPING", "1000",
            "Typing loops one worker runs at once; beyond it a conversation shows no indicator."),
        Var("AGENTLOOP_MAX_TURN_CHARS", "16000",
            "A turn's merged input is cut to this many characters, marked `[… N characters cut]` "
            "(the messages keep all of it)."),
        Var("AGENTLOOP_GROUP_CONTEXT_MESSAGES", "20",
            "In a group: how many of the messages not addressed to the agent (since the chat's last "
            "turn) are given to the next turn that is, the newest kept."),
        Var("AGENTLOOP_SCHEDULE_BATCH", "200",
            "Scheduled messages a worker sends per round (about every 5 s); more due wait for the next."),
        Var("AGENTLOOP_MAX_PENDING_MESSAGES", "200",
            "Messages a conversation may have waiting for a turn; later ones are stored, "
            "audited and answered with one notice."),
        Var("AGENTLOOP_WORKER_STALE_AFTER", "30",
            "A worker judged by its heartbeat and silent this long is dead; its work is "
            "recovered (a worker holding its liveness lock is alive however old its heartbeat)."),
        Var("AGENTLOOP_LIVENESS", "`advisory` on PostgreSQL, `heartbeat` on SQLite",
            "How workers tell that another died: its advisory lock freed (seconds), or its "
            "heartbeat gone stale."),
        Var("AGENTLOOP_LIVENESS_DATABASE_URL", "`DATABASE_URL`",
            "The liveness lock's connection: PostgreSQL itself (same database) when "
            "`DATABASE_URL` goes through a transaction-mode pooler."),
        Var("AGENTLOOP_LIVENESS_TIMEOUT", "3",
            "Seconds of silence after which the lock's session is given up, on both ends (TCP "
            "keepalives, `tcp_user_timeout`)."),
        Var("AGENTLOOP_HOSTNAME", "the host name",
            "The host name in workers' owner stamps; workers with the same one judge each "
            "other's pids directly (containers sharing the host's network need a name each)."),
        Var("Q_WORKERS", "1", "django-q2 worker processes (the safety-net sweeps)."),
    ]),
    ("Files users send", "Photos, albums, voice notes and documents: fetched from the platform after "
     "their message is stored, shown to the agent (docs/media.md).", [
        Var("AGENTLOOP_MEDIA_ROOT", "`var/files`", "Where Django's default storage keeps fetched files."),
        Var("AGENTLOOP_S3_BUCKET", "empty: the filesystem",
            "An S3-compatible bucket for the files instead (django-storages), shared by every host."),
        Var("AGENTLOOP_S3_ENDPOINT_URL", "empty: AWS", "The S3 endpoint (MinIO, Ceph, R2, a local server…)."),
        Var("AGENTLOOP_S3_REGION", "empty: boto3's default", "The bucket's region."),
        Var("AGENTLOOP_S3_ACCESS_KEY_ID", "empty: boto3's own chain", "The access key id."),
        Var("AGENTLOOP_S3_SECRET_ACCESS_KEY", "empty: boto3's own chain", "The secret access key."),
        Var("AGENTLOOP_S3_PREFIX", "empty", "A folder in the bucket the files go under."),
        Var("AGENTLOOP_MEDIA_MAX_BYTES", "20000000",
            "One file at most, in bytes (Telegram serves bots files up to 20 MB); a larger one is "
            "described to the model, never fetched."),
        Var("AGENTLOOP_MEDIA_MAX_TURN_BYTES", "50000000",
            "Bytes of files one burst may carry, in all: a file that would take its burst beyond "
            "is described to the model, never fetched; images beyond it in one turn are described."),
        Var("AGENTLOOP_MEDIA_FETCH_DEADLINE", "30", "Seconds one fetch of a file may take, overall."),
        Var("AGENTLOOP_MEDIA_ATTEMPTS", "4",
            "Tries of a fetch that fails (backing off 1, 3, 9 s) before the model is told the file "
            "could not be read."),
        Var("AGENTLOOP_MEDIA_WAIT", "30",
            "Seconds a turn waits for its files to be fetched; it runs without those still missing "
            "(the model is told)."),
        Var("AGENTLOOP_MEDIA_POLL", "0.5",
            "Seconds between a worker's looks for files to fetch while their burst's window is open."),
        Var("AGENTLOOP_MEDIA_IMAGE_MAX_SIDE", "1568",
            "Images larger than this many pixels on their longer side are downscaled (JPEG) before "
            "a model sees them."),
        Var("AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS", "40000000",
            "The most pixels agentloop decodes of one image (to downscale it for a model, to make "
            "a thumbnail); a JPEG counts at the reduced scale it is decoded at. An image over it is "
            "stored but never decoded: the model is told it was sent and why it is not shown, its "
            "thumbnail link answers 422; past twice it Pillow refuses to open it. Decoding takes up to 4 bytes "
            "a pixel: 160 MB at the default, which an 8K screenshot (33 Mpx) stays under, and a phone's "
            "full-size photo too (a JPEG decodes at 1/2 to 1/8 of its size)."),
        Var("AGENTLOOP_MEDIA_URL_TTL", "3600",
            "Seconds a signed link to a file works (the `media` of a webhook or pull agent's turn)."),
        Var("AGENTLOOP_MEDIA_URL_CA_BUNDLE", "empty: the public CAs only",
            "A PEM file of more CA certificates trusted when fetching a file given by its `https` URL "
            "(the API's `media_url`): an internal CA. Which hosts may be private: a channel's "
            "`allowed_media_hosts`."),
        Var("AGENTLOOP_TRANSCRIPTION_BASE_URL", "empty: voice notes are not transcribed",
            "An OpenAI-compatible server whose `/v1/audio/transcriptions` turns voice notes and "
            "audio into text, once per file (a channel's `agent_config.transcription` may name "
            "its own, or `false`)."),
        Var("AGENTLOOP_TRANSCRIPTION_MODEL", "whisper-1", "The transcription model."),
        Var("AGENTLOOP_TRANSCRIPTION_API_KEY_ENV", "OPENAI_API_KEY",
            "The environment variable holding the transcription server's key (a `…_API_KEY` name)."),
        Var("AGENTLOOP_TRANSCRIPTION_TIMEOUT", "60", "Seconds one transcription may take, overall."),
    ]),
    ("Telegram", "Per process; each channel's own settings are in the admin.", [
        Var("AGENTLOOP_TELEGRAM_POLL_TIMEOUT", "25", "Long-polling timeout, seconds."),
        Var("AGENTLOOP_TELEGRAM_CONNECTIONS", "8",
            "HTTP connections per bot for replies (as many again for typing)."),
        Var("AGENTLOOP_TELEGRAM_POOL_TIMEOUT", "30",
            "Seconds a reply waits for a connection, a free one of those or a new one (then: "
            "not sent, resent unlabelled)."),
        Var("AGENTLOOP_TELEGRAM_READ_TIMEOUT", "5",
            "Seconds for Telegram's answer once a reply went out (then: may have arrived, "
            "resent labelled)."),
    ]),
    ("Agents", "The agents that answer turns.", [
        Var("AGENTLOOP_AGENT_DEADLINE", "300",
            "Seconds an agent's whole answer may take (every model request and tool call of "
            "one turn), or the turn fails with an apology; a channel's agent config may set "
            "its own `deadline`."),
        Var("AGENTLOOP_AGENT_MAX_ANSWER_BYTES", "30000000",
            "Bytes a webhook agent's answer may have (its `files` inline, in base64: room for "
            "one file at `AGENTLOOP_MEDIA_MAX_BYTES`): past them reading stops and the turn "
            "fails, naming this setting."),
        Var("AGENTLOOP_EXTRA_AGENTS", "empty", "`name=dotted.path,…` agents added to the registry."),
        Var("AGENTLOOP_EXTRA_PLATFORMS", "empty",
            "`kind=dotted.path,…` platforms of your own added to the registry (docs/adding-a-platform.md)."),
        Var("AGENTLOOP_EXTERNAL_TURN_TIMEOUT", "300",
            "A turn handed to a pull or webhook agent and not closed in time is released."),
        Var("AGENTLOOP_EXTERNAL_TURN_ATTEMPTS", "3",
            "Starts a handed-over turn gets (claims and worker runs); then it fails and the user is told."),
        Var("AGENTLOOP_AGENT_KEY_ENVS", "empty",
            "Variables an agent's `api_key_env` may name besides `*_API_KEY` (never "
            "`SECRET_KEY` or `DATABASE_URL`: the value is sent to the agent's URL)."),
        Var("OPENAI_API_KEY", "empty",
            "The `openai` agent's key (or the variable the channel's `--agent-key-env` "
            "names), read from the worker's environment, never stored.",
            read_by="the `openai` agent"),
    ]),
    ("The delivery ledger", "Layer 3: every reply at least once.", [
        Var("AGENTLOOP_DELIVERY_LEDGER", "true",
            "`false`: replies are sent from memory, once (a crash loses those in flight)."),
        Var("AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT", "300",
            "Seconds after which a row still `attempting` is orphaned, whoever holds it."),
        Var("AGENTLOOP_CALLBACK_TIMEOUT", "10",
            "Seconds for one outbound HTTP exchange (an `api` channel's callback POST, a "
            "WhatsApp send), from connect to the last byte of the answer."),
        Var("AGENTLOOP_SAFETY_SWEEP_BUDGET", "40",
            "Seconds after which django-q2's safety sweep stops claiming rows (under the "
            "task timeout)."),
    ]),
    ("Retention", "How long each kind of data is kept (docs/operations.md, Retention); the sweep runs "
     "every 10 minutes under django-q2 and deletes in batches.", [
        Var("AGENTLOOP_RETAIN_MESSAGES_DAYS", "30",
            "Days a conversation's data is kept: inbound messages and their edits, finished "
            "buffers and turns, notes for the agent, files users sent (rows and stored bytes). "
            "Never deleted whatever their age: an open buffer, a ready or running turn, a file "
            "still being fetched, and the 20 newest finished turns and notes of a conversation "
            "active within these days (what its agent reads)."),
        Var("AGENTLOOP_RETAIN_LEDGER_DAYS", "7",
            "Days a finished ledger row (delivered, abandoned, unreachable) is kept; open "
            "ones (pending, attempting, failed) never go."),
        Var("AGENTLOOP_RETAIN_CLAIMS_DAYS", "30",
            "Days the guard's claims are kept after their window ends (done or released "
            "only; in flight, uncertain and proposed ones stay), with their proposals once "
            "decided."),
        Var("AGENTLOOP_RETAIN_AUDIT_DAYS", "365", "Days audit events are kept (the longest)."),
        Var("AGENTLOOP_RETAIN_SCHEDULES_DAYS", "30",
            "Days a scheduled message is kept once sent or cancelled, counted from its last tick "
            "(never sent: from its creation); waiting ones never go."),
        Var("AGENTLOOP_RETAIN_UNREACHABLE_DAYS", "30",
            "Days an unreachable chat's mark (the chat's id, the platform's refusal) is kept after "
            "the last send it refused; a later refusal marks it again."),
        Var("AGENTLOOP_RETENTION_BATCH", "`500` on PostgreSQL, `100` on SQLite",
            "Rows deleted per transaction: each batch holds its locks for milliseconds (SQLite's "
            "one write lock: a smaller batch, so admissions wait less during a sweep)."),
        Var("AGENTLOOP_RETENTION_SWEEP_BUDGET", "40",
            "Seconds one sweep may run (under django-q2's task timeout); the next one goes on."),
    ]),
    ("The action guard and its tools", "Layer 2: an action asked twice runs once.", [
        Var("AGENTLOOP_GUARD_WAIT", "3.0",
            "Seconds an identical call waits for one in flight before answering \"in progress\"."),
        Var("AGENTLOOP_TOOL_THREADS", "16", "Threads per worker for tool calls made inside turns."),
        Var("AGENTLOOP_EXTRA_TOOLS", "empty", "Dotted paths of your own tools, comma-separated."),
        Var("AGENTLOOP_MAX_ACTIONS_PER_KEY", "100",
            "Distinct guard-only action names per agent key (`/api/v1/actions/claim`); more get 429."),
        Var("AGENTLOOP_DEFAULT_TIME_ZONE", "`TIME_ZONE`",
            "The zone of dates given without one (\"2026-12-01T10:00\"), and of the times "
            "in a confirmation's answers."),
        Var("AGENTLOOP_CALENDAR_BACKEND", "local",
            "`local` (our database and an iCalendar feed) or `caldav`."),
        Var("AGENTLOOP_CALDAV_URL", "empty", "The CalDAV server."),
        Var("AGENTLOOP_CALDAV_USERNAME", "empty", "The CalDAV account's user name."),
        Var("AGENTLOOP_CALDAV_PASSWORD", "empty", "The CalDAV account's password."),
        Var("AGENTLOOP_CALDAV_CALENDAR", "agentloop", "The CalDAV calendar's name (created if missing)."),
        Var("AGENTLOOP_CALDAV_TIMEOUT", "15", "Seconds a CalDAV request may take."),
        Var("EMAIL_URL", "consolemail://",
            "Where `email_send` sends: `smtp://`, `smtp+tls://user:pass@host:587`, `smtps://…`."),
        Var("DEFAULT_FROM_EMAIL", "agentloop@localhost", "The sender of `email_send`."),
        Var("EMAIL_TIMEOUT", "20", "SMTP socket timeout, seconds."),
    ]),
    ("Metrics", "`GET /metrics` in Prometheus' text format ([Metrics](metrics.md)).", [
        Var("AGENTLOOP_METRICS_TOKEN", "empty (no token: staff logins only)",
            "A scraper's credential: `Authorization: Bearer <this>` reads `/metrics` (compared in "
            "constant time). Staff with the `view_metrics` permission (operators, auditors) read it "
            "logged in; anyone else gets 401 or 403."),
        Var("AGENTLOOP_METRICS_DIR", "`var/metrics`",
            "Where the web, worker and tasks processes of one host share their figures "
            "(prometheus-client's multiprocess mode): created at start, and wiped when a process "
            "starts and finds none of the others alive. One per host (one pid space); never shared "
            "between hosts or containers."),
    ]),
    ("Traces", "Optional OpenTelemetry traces of a message's path, sent to an OTLP/HTTP collector "
               "([Metrics](metrics.md#traces)). Off unless configured: then OpenTelemetry is not even loaded.", [
        Var("AGENTLOOP_TRACING", "auto",
            "`auto`: trace when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` "
            "names a collector; `true`: trace (to OTLP/HTTP's default `http://localhost:4318` if none is "
            "named); `false`: never. `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off too. "
            "Any other value: the process refuses to start, saying so."),
        Var("OTEL_EXPORTER_OTLP_ENDPOINT", "empty",
            "The collector's OTLP/HTTP base URL (`http://tempo:4318`); spans are posted to `/v1/traces` "
            "below it.", read_by=OTEL),
        Var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "empty",
            "The whole URL spans are posted to, instead (`http://jaeger:4318/v1/traces`).", read_by=OTEL),
        Var("OTEL_EXPORTER_OTLP_HEADERS", "empty",
            "Headers sent with each export (`authorization=Bearer …`), comma-separated `key=value`.",
            read_by=OTEL),
        Var("OTEL_EXPORTER_OTLP_TIMEOUT", "5",
            "Seconds one export may take, retries included (the Python exporter reads seconds); a batch "
            "not taken by then is dropped.", read_by=OTEL),
        Var("OTEL_SERVICE_NAME", "agentloop", "The traces' `service.name`.", read_by=OTEL),
        Var("OTEL_TRACES_SAMPLER", "parentbased_always_on",
            "Which traces are kept, decided at a message's admission and followed by every later span "
            "of its path (`parentbased_traceidratio` with `OTEL_TRACES_SAMPLER_ARG=0.1`: one in ten).",
            read_by=OTEL),
        Var("OTEL_BSP_MAX_QUEUE_SIZE", "2048",
            "Spans waiting to be exported in a process; a span that finds the queue full is dropped "
            "(said once in the log), never waited for.", read_by=OTEL),
        Var("OTEL_BSP_SCHEDULE_DELAY", "5000", "Milliseconds between two exports of the queue.", read_by=OTEL),
    ]),
    ("Logging", "", [
        Var("LOG_LEVEL", "INFO", "Root log level."),
        Var("DJANGO_Q_LOG_LEVEL", "WARNING",
            "django-q2's own logger (`INFO` logs every routine sweep: eight lines each 30 s)."),
    ]),
    ("Tests", "For the test suite and the crash matrix; leave unset in production.", [
        Var("AGENTLOOP_FAILPOINT", "empty",
            "Named fault points that kill the process with SIGKILL when hit "
            "(`ledger.after_send`, `ledger.after_send@3`, comma-separated); the crash matrix "
            "arms one per run.",
            read_by="the fault points (`failpoint()`)"),
    ]),
]

VARIABLES: list[Var] = [var for _, _, rows in GROUPS for var in rows]
