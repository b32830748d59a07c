"""The settings that read no environment: the middleware chain, the template engine and the
API schema's settings. agentloop/settings.py imports them; everything read from the
environment stays there (tests/unit/test_config_docs.py parses that file)."""

from pathlib import Path

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

SPECTACULAR_SETTINGS = {
    "TITLE": "agentloop API",
    "DESCRIPTION": "Inbound messages, tools behind the action guard, turns and replies.",
    "VERSION": "1.0.0",
    # The docs page's assets come from our own static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # 3.1: JSON Schema's whole vocabulary, e.g. `propertyNames` (what an object's keys may be).
    "OAS_VERSION": "3.1.0",
}
