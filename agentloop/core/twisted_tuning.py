"""Under daphne, Twisted parses every request's Content-Type header with the email
package (twisted.web.http._parseContentType, an EmailMessage per request) only to decide
whether to parse a form body, which daphne never reads: 6-10% of the web process's CPU
under webhook load in the profile of issue 12. The same header line always parses the
same way, so the answers are cached (bounded: the line is the client's choice)."""

import functools

CACHED_CONTENT_TYPES = 64


def cache_content_type_parsing() -> None:
    try:
        from twisted.web import http
    except ImportError:  # another server than daphne: nothing to tune
        return
    parse = getattr(http, "_parseContentType", None)
    if parse is not None and not hasattr(parse, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=CACHED_CONTENT_TYPES)(parse)
