"""Secrets never leave their field.

One function, `redact`, is applied wherever text that may carry a secret is *written*:
every stored error (a ledger row's last error, an unreachable chat's, a turn's outcome,
a claim's), every audit summary, every log record this product's processes create
(installed as the log record factory when agentloop.core's app is ready), and every payload
the API and the console's websockets send. It masks:

- the deployment's own secrets, wherever they appear: each channel's bot token, webhook
  secret and callback secret, the secrets inside its callback and agent URLs, its agent's
  secret and API key (the value of the environment variable `api_key_env` names),
  each MCP server's header values and stdio environment (tools.mcp), SECRET_KEY, the
  database's password, and environment variables named like secrets;
- the shapes a secret takes in error texts even when we do not know it: a Bot API URL
  (`/bot<id>:<token>/`), a bare bot token, a URL's user-info, a URL's query parameters
  named like secrets, a value after a name like a secret's anywhere (`password=…`,
  `"api_key": "…"`, `client_secret: …`), `Bearer …` headers, `sk-…` API keys.

Texts are also matched decoded: percent-encoding undone (`123%3AAAH…`, twice at most),
JSON's escapes undone (a backslash before `/`, `u003a`, `n`), a line break between two
non-blank characters (a token wrapped across lines) removed. When the decoded text shows
a secret the raw one hid, the decoded text, masked, is returned; otherwise the text keeps
its form.

The channels' secrets are read from the database at most every REFRESH_SECONDS (and at
once after a channel is saved in this process), only where a query is safe: never from
an event loop's thread (Django refuses it) and never inside a transaction that already
failed; otherwise the last list read is used, and callers that hold a channel pass its
secrets themselves (`redact(text, channel_secrets(channel))`). No query is ever made
while a log record is created.

This module is imported from everywhere (settings-free at import, no model imports at
module level), so it lives in the bottom layer, agentloop.core. What the apps above know — which
settings of a channel are secret (its platform's), which secrets they store — it reaches
through settings, by dotted path (agentloop.core.plugins): AGENTLOOP_PLATFORMS and
AGENTLOOP_SECRET_SOURCES.
"""

import asyncio
import logging
import os
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from agentloop.core import plugins

MASK = "•••"
# Shorter values would mask ordinary words; the patterns below still catch their shapes.
MIN_SECRET = 6
REFRESH_SECONDS = 30.0

SECRET_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|pwd|sig|signature|auth|credential)")
SECRET_ENV = re.compile(r"(?i)(_KEY|_TOKEN|_SECRET|PASSWORD|_PASS)$")

# (pattern, replacement) for secrets we recognise by their shape.
PATTERNS = [
    (re.compile(r"/bot\d+:[^/\s'\"?#]+"), "/bot" + MASK),
    # Not after a letter or digit (base64 is not a bot id), but after "_" or "%" it is.
    (re.compile(r"(?<![A-Za-z0-9])\d{3,}:[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)([?&;][a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|sig|signature|auth|credential)"
                r"[a-z0-9_.-]*=)[^&#\s'\"]+"), r"\1" + MASK),
    # A name like a secret's, "=" or ":" (a JSON key's quotes allowed), a value of 6+
    # characters: shorter ones ("tokens: 5", "the key: turn") are ordinary words. The
    # secret's word ends the name or a separator follows it ("KeyError: 'title'" is not one).
    (re.compile(r"(?i)(\b[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|signature|credential)(?:[_.-][a-z0-9_.-]*)?"
                r"[\"']?\s*[=:]\s*[\"']?)[^\s\"'&,;}<>]{6,}"), r"\1" + MASK),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + MASK),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{12,}"), MASK),
]
JSON_ESCAPE = re.compile(r"\\(/|u[0-9a-fA-F]{4}|n|r)")
WRAPPED = re.compile(r"(?<=\S)[ \t]*\r?\n(?=\S)")  # a line break inside a word (a wrapped token)


def redact(text: object, also: Iterable[str] = ()) -> str:
    """`text` with every secret masked; `also`: more secrets the caller knows about."""
    if not text:
        return "" if text is None else str(text)
    secrets = list(_variants(also))
    masked = _mask(str(text), secrets)
    decoded = _decoded(masked)
    if decoded != masked:
        again = _mask(decoded, secrets)
        if again != decoded:  # decoding showed a secret the raw text hid
            return again
    return masked


def _mask(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    known = _known.pattern()
    if known is not None:
        text = known.sub(MASK, text)
    for pattern, replacement in PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _decoded(text: str) -> str:
    """The text as a secret in it reads: JSON escapes and percent-encoding undone, a
    word wrapped across lines joined. Cheap for a text with none of them."""
    if "\\" in text:
        text = JSON_ESCAPE.sub(_unescape, text)
    for _ in range(2):  # encoded twice (a URL inside a URL's query) at most
        if "%" not in text:
            break
        text = unquote(text)
    return WRAPPED.sub("", text) if "\n" in text else text


def _unescape(match: re.Match[str]) -> str:
    escape = match[1]
    return {"/": "/", "n": "\n", "r": "\r"}.get(escape) or chr(int(escape[1:], 16))


def redact_payload(value: Any) -> Any:
    """Every string inside a JSON-like payload (dicts, lists), redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_payload(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_payload(item) for item in value]
    return value


# Secrets can surface inside error texts (a Bot API URL carries the bot token): the admin
# shows texts redacted to everyone (they are redacted when written too; this covers older rows).
def hide_secrets(text: str) -> str:
    return redact(text)


def _variants(secrets: Iterable[str]) -> Iterator[str]:
    """Each secret as written and as it appears percent-encoded in a URL."""
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET:
            yield secret
            encoded = quote(secret, safe="")
            if encoded != secret:
                yield encoded


# --- what the deployment's secrets are ------------------------------------------------------


def url_secrets(url: object) -> list[str]:
    """The secret parts of a URL: its user-info, its query values, a long random-looking
    path segment (webhook URLs often carry their key in the path)."""
    if not url:
        return []
    try:
        parts = urlsplit(str(url))
    except ValueError:
        return []
    found = [parts.password or "", parts.username or ""]
    found += [value for _, value in parse_qsl(parts.query, keep_blank_values=False)]
    found += [seg for seg in parts.path.split("/") if len(seg) >= 16 and re.search(r"\d", seg)
              and re.search(r"[A-Za-z]", seg)]
    return [value for value in found if len(value) >= MIN_SECRET]


def agent_secrets(config: dict[str, Any] | None) -> list[str]:
    """Secrets in a channel's agent_config: keys named like secrets, the URLs' secrets,
    and the value of the environment variable `api_key_env` names."""
    found: list[str] = []
    for name, value in (config or {}).items():
        if not isinstance(value, str):
            continue
        if name == "api_key_env":
            found.append(os.environ.get(value, ""))
        elif name.endswith("url"):
            found += url_secrets(value)
        elif SECRET_NAME.search(name):
            found.append(value)
    return [value for value in found if value and len(value) >= MIN_SECRET]


def channel_secrets(channel: Any) -> list[str]:
    """Every secret one channel holds (a Channel, or a dict of its fields): its platform's
    secret settings and the secrets in its settings' URLs (the platform says which, see
    conversations.platforms), and its agent's."""
    get: Callable[..., Any] = channel.get if isinstance(channel, dict) else \
        lambda name, default="": getattr(channel, name, default)
    found = _platform_secrets(channel, get("kind", ""))
    found += agent_secrets(get("agent_config", None))
    return [value for value in found if value and len(value) >= MIN_SECRET]


class SecretSettings(Protocol):
    """What redaction needs of a platform (settings.AGENTLOOP_PLATFORMS, resolved by
    agentloop.core.plugins: the platforms sit layers above this one)."""

    def secrets(self, channel: Any) -> list[str]:
        """The values of this channel's secret settings (a Channel, or a dict of its fields)."""
        ...


def _platform_secrets(channel: Any, kind: str) -> list[str]:
    platform: SecretSettings | None = plugins.instances("AGENTLOOP_PLATFORMS").get(kind) if apps.ready else None
    if platform is None:
        # A kind no longer registered (or the platforms not loadable yet): every string among its settings is masked.
        values = channel.get("platform_settings") if isinstance(channel, dict) else channel.platform_settings
        return [v for v in (values or {}).values() if isinstance(v, str)]
    return platform.secrets(channel)


def deployment_secrets() -> list[str]:
    """Secrets of the deployment itself: SECRET_KEY, database passwords, the secrets in
    the channel layer's and cache's URLs, environment variables named like secrets."""
    found = [getattr(settings, "SECRET_KEY", "")]
    for database in getattr(settings, "DATABASES", {}).values():
        found.append(database.get("PASSWORD") or "")
    for name, value in os.environ.items():
        if SECRET_ENV.search(name):
            found.append(value)
        elif name.endswith("_URL"):
            found += url_secrets(value)
    return [value for value in found if value and len(value) >= MIN_SECRET]


class _Known:
    """The deployment's secrets as one compiled pattern, longest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None
        self._expires = 0.0

    def pattern(self) -> re.Pattern[str] | None:
        if time.monotonic() >= self._expires and _may_query():
            self.reload()
        return self._pattern

    def forget(self, **kwargs: Any) -> None:
        self._expires = 0.0

    def reload(self) -> None:
        with self._lock:
            self._expires = time.monotonic() + REFRESH_SECONDS
            try:
                secrets = set(_variants(deployment_secrets() + _stored_secrets()))
            except Exception:  # the database away: keep the list we had
                return
            ordered = sorted(secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None


def _stored_secrets() -> list[str]:
    """The secrets the higher apps store (settings.AGENTLOOP_SECRET_SOURCES: every
    channel's, every MCP server's). Inside a transaction each source reads in a savepoint:
    a failure must not doom the caller's. A source that fails gives nothing (its table not
    migrated yet) while another answers; when none answers, the database is away and the
    failure is raised (reload keeps the list it had)."""
    found: list[str] = []
    failure: DatabaseError | None = None
    answered = False
    for source in plugins.each("AGENTLOOP_SECRET_SOURCES"):
        try:
            if connection.in_atomic_block:
                with transaction.atomic():
                    secrets = source()
            else:
                secrets = source()
        except DatabaseError as exc:
            failure = exc
            continue
        found += secrets
        answered = True
    if failure is not None and not answered:
        raise failure
    return found


def _may_query() -> bool:
    """A query is safe here: apps loaded, no event loop in this thread, no failed transaction."""
    if not apps.ready or _in_log_record.active:
        return False
    try:
        asyncio.get_running_loop()
        return False
    except RuntimeError:
        pass
    return not connection.needs_rollback


_known = _Known()


def forget_secrets(**kwargs: Any) -> None:
    """A channel changed: read the secrets again before the next redaction here."""
    _known.forget()


# --- log records ----------------------------------------------------------------------------


class _Flag(threading.local):
    active = False


_in_log_record = _Flag()


def install_log_redaction() -> None:
    """Every log record this process creates carries redacted text: its message, its
    traceback and its stack (whatever handler — console, file, a test's capture — shows it)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacts", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _in_log_record.active = True
        try:
            _redact_record(record)
        finally:
            _in_log_record.active = False
        return record

    factory.redacts = True  # type: ignore[attr-defined]  # a mark on the function: installed once
    logging.setLogRecordFactory(factory)


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: the handler will say so
        return
    record.msg, record.args = redact(message), ()
    if record.exc_info and record.exc_info[0] is not None:
        record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
