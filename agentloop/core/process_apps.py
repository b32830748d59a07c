"""The apps a process installs, by the command it runs (`sys.argv`, read by settings.py).

- `manage.py runserver` takes daphne's app first: it swaps `runserver` for its ASGI server
  (websockets work there), and it imports Twisted's reactor at set-up to do it, a third of
  a worker's start-up, which needs neither. The product serves through uvicorn
  (agentloop/web_server.py); the app is only for runserver.
- A worker (`runloop`) and the task cluster (`qcluster`) serve no page: their admin is
  `SimpleAdminConfig`, so its modules are imported with the URLconf, if that process ever
  loads it (a signed link's `reverse()`; agentloop/urls.py autodiscovers), not at set-up.
  The theme's ModelAdmin renders a widget while its class is defined, and that widget's
  template engine imports every app's template tags: a worker's django.setup() took
  0.22-0.27 s of CPU with them and 0.12-0.14 s without (forked from preloaded libraries,
  as the tests' processes are).
"""

from collections.abc import Sequence

ADMIN, SIMPLE_ADMIN = "django.contrib.admin", "django.contrib.admin.apps.SimpleAdminConfig"
PAGELESS = ("runloop", "qcluster")


def installed_apps(argv: Sequence[str], apps: list[str]) -> list[str]:
    """`apps` as the process `argv` runs them."""
    command = argv[1] if len(argv) > 1 else ""
    if command == "runserver":
        return ["daphne", *apps]
    if command in PAGELESS:
        return [SIMPLE_ADMIN if app == ADMIN else app for app in apps]
    return apps
