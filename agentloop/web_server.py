"""The web process: uvicorn (httptools' parser, uvloop's event loop, the websockets
library) serving agentloop.asgi, with its access log's URLs masked.

    python -m agentloop.web_server --host 0.0.0.0 --port 8000 [--access-log]

Why uvicorn, measured (web process alone on SQLite, 3,000 Telegram webhook POSTs, 16
keep-alive clients, two rounds): daphne spent 1.54-1.65 ms of CPU per POST at 600-671/s;
uvicorn with httptools and uvloop 1.02-1.06 ms at 950-993/s. Twisted's per-request work
(headers, the email package's content-type parsing, its reactor) was a third of the web
process.

The access log (one line per request, only with --access-log) goes through logging like
every other line: Django's LOGGING configures it (uvicorn's own logging configuration is
not applied), the redacting record factory covers it, and the URL in it is masked first
(a calendar's feed token, a signed file link, WhatsApp's `hub.verify_token`).

The client's address is the peer's, unless the peer is one of AGENTLOOP_TRUSTED_PROXIES:
then it is the one its X-Forwarded-For names (uvicorn's proxy headers, believed from those
addresses only), and X-Forwarded-Proto its scheme. django-axes locks a login out per
username and that address, so behind a proxy it must be the client's: at the proxy's, five
wrong passwords from anyone locked a username out for everyone.
"""

import argparse
import logging
import os
import re

import uvicorn

from agentloop.core.access_log import masked_url

APPLICATION = "agentloop.asgi:application"
# Seconds a stopping web process gives its open requests (a long poll, a stream) before it
# closes them: inside the ten `manage.py runall` waits before it kills.
GRACEFUL_SHUTDOWN = 5


class MaskedAccessLine(logging.Filter):
    """uvicorn's access line, `client - "METHOD /path?query HTTP/1.1" status`, with its path
    masked before any handler writes it. By then the record's message is already formatted
    (the redacting record factory formats every record as it is made)."""

    REQUEST = re.compile(r'^(?P<head>.*?"[A-Z]+ )(?P<path>\S+)(?P<tail> HTTP/.*)$', re.DOTALL)

    def filter(self, record: logging.LogRecord) -> bool:
        line = self.REQUEST.match(record.getMessage())
        if line:
            record.msg, record.args = line["head"] + masked_url(line["path"]) + line["tail"], ()
        return True


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agentloop.web_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", "-b", default="127.0.0.1")
    parser.add_argument("--port", "-p", type=int, default=8000)
    parser.add_argument("--access-log", action="store_true", help="a line per request (URLs masked)")
    parser.add_argument("--nice", type=int, default=0, help="added to the process's niceness before any thread starts")
    return parser.parse_args(argv)


def trusted_proxies() -> list[str]:
    """AGENTLOOP_TRUSTED_PROXIES, as the settings read and checked it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    from django.conf import settings

    return list(settings.AGENTLOOP_TRUSTED_PROXIES)


def main(argv: list[str] | None = None) -> None:
    options = arguments(argv)
    if options.nice:
        # Before uvicorn or Django start a thread: a thread takes its creator's niceness.
        os.nice(options.nice)
    logging.getLogger("uvicorn.access").addFilter(MaskedAccessLine())
    proxies = trusted_proxies()
    uvicorn.run(
        APPLICATION, host=options.host, port=options.port,
        loop="uvloop", http="httptools", ws="websockets-sansio",
        # Django's ASGI handler speaks no lifespan; Django's LOGGING configures the logs.
        lifespan="off", log_config=None, access_log=options.access_log,
        # Forwarded headers believed from the trusted proxies only, none by default (module
        # docstring); not uvicorn's default (127.0.0.1, or FORWARDED_ALLOW_IPS): whom to
        # believe is the deployment's to say, in one setting.
        proxy_headers=bool(proxies), forwarded_allow_ips=proxies,
        server_header=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )


if __name__ == "__main__":
    main()
