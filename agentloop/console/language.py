"""The reader's language on the console's websockets. A page picks it through Django's
LocaleMiddleware (the language switch's cookie, else the browser's Accept-Language); a
websocket passes no middleware, so its handshake's scope is read the same way, and what
the server writes for the page (labels of kinds) is built in it."""

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, ParamSpec, TypeVar

from django.utils import translation

Params = ParamSpec("Params")
Result = TypeVar("Result")


def language_of(scope: Mapping[str, Any]) -> str:
    headers = dict(scope.get("headers") or [])
    request = SimpleNamespace(COOKIES=scope.get("cookies") or {}, path_info=scope.get("path", ""),
                              META={"HTTP_ACCEPT_LANGUAGE": headers.get(b"accept-language", b"").decode("latin-1")})
    return translation.get_language_from_request(request)  # type: ignore[arg-type]  # reads only these three


def speaking(language: str, fn: Callable[Params, Result]) -> Callable[Params, Result]:
    """`fn` run in `language` (translation is per thread: it wraps the function a
    database_sync_to_async thread runs, not the await)."""
    def run(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        with translation.override(language):
            return fn(*args, **kwargs)
    return run
