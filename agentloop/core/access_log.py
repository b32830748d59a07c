"""Request URLs as logs may show them: every secret a URL carries masked.

A URL can carry a credential where no log record's text would show it as one: a route's
own token (a calendar's feed `/calendars/<token>.ics`, a signed file link `/files/<token>`)
and a query parameter named like a secret (WhatsApp's `hub.verify_token=`). The web
server's access log (agentloop/daphne_server.py) and Django's request log (`Not Found:
<path>`, the MaskRequestPath filter in settings.LOGGING) write URLs through `masked_url`.
"""

import logging
import re
from urllib.parse import quote, unquote, unquote_plus

from django.urls import Resolver404, resolve

from agentloop.core.redaction import MASK, SECRET_NAME, redact


def masked_url(url: str) -> str:
    """`url` (a path with its query string, as sent) with the route's secret parts and
    the secret query values masked, then redacted like any text."""
    path, mark, query = url.partition("?")
    return redact(_masked_path(path) + mark + _masked_query(query))


def _masked_path(path: str) -> str:
    """The values of a route's path arguments named like secrets (`token`), masked."""
    try:
        match = resolve(unquote(path))
    except (Resolver404, ValueError):
        return path
    except Exception:  # a log line must never fail a request
        return path
    for name, value in match.kwargs.items():
        if SECRET_NAME.search(name) and isinstance(value, str) and value:
            for form in {quote(value, safe=""), quote(value), value}:
                path = path.replace(form, MASK)
    return path


def _masked_query(query: str) -> str:
    parts = re.split(r"([&;])", query)
    for index in range(0, len(parts), 2):
        name, equals, value = parts[index].partition("=")
        if equals and value and SECRET_NAME.search(unquote_plus(name)):
            parts[index] = f"{name}={MASK}"
    return "".join(parts)


class MaskRequestPath(logging.Filter):
    """Django's request log names the request's path (`Forbidden: /files/<token>`): the
    path is written masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", "")
        if path and isinstance(record.msg, str) and path in record.msg:
            record.msg = record.msg.replace(path, masked_url(path))
        return True
