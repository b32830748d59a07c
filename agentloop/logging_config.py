"""The logging configuration (settings.LOGGING): one formatter to the console, the noisy
libraries quietened, request paths masked (agentloop.core.access_log), psycopg's pool
logged once per kind of fault (agentloop.core.pool_log). settings.py reads the levels
from the environment and passes them in."""


def logging_config(level: str, django_q_level: str) -> dict:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
        "filters": {"once_per_kind": {"()": "agentloop.core.pool_log.OncePerKind"},
                    "request_path": {"()": "agentloop.core.access_log.MaskRequestPath"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "httpx": {"level": "WARNING"},
            "httpx2": {"level": "WARNING"},  # the openai SDK's HTTP client logs every request at INFO
            "telegram": {"level": "WARNING"}, "axes": {"level": "WARNING"},  # axes: a start banner per process
            "daphne": {"level": "WARNING"},  # `manage.py runserver` under DEBUG
            # The web process (agentloop.web_server): its start-up lines quiet, its access
            # log (--access-log) at INFO, masked.
            "uvicorn": {"level": "WARNING"}, "uvicorn.access": {"level": "INFO"},
            "django.request": {"filters": ["request_path"]},  # `Forbidden: /files/<token>`, masked
            # django-q2 logs as "django-q": eight INFO lines per routine sweep every 30 s.
            # Our tasks log themselves when they find something to do.
            "django-q": {"level": django_q_level},
            # DATABASE_POOL: psycopg's pool logs every failed reconnect of an outage (several
            # a second): the first of a kind is kept (it names the cause), then one in 30 s.
            "psycopg.pool": {"filters": ["once_per_kind"]},
        },
    }
