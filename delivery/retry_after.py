"""How long a peer asked us to wait (Telegram's `retry_after`, HTTP's `Retry-After`),
made sane: within [1 s, 1 h]. Read literally, 0 would resend on every poll for a day,
and 1e400 or 99999999999 would overflow the clock or strand the reply for centuries."""

import email.utils
import math
import time
from typing import Any

RETRY_AFTER_MIN, RETRY_AFTER_MAX, RETRY_AFTER_DEFAULT = 1.0, 3600.0, 30.0


def clamp_retry_after(value: Any, default: float = RETRY_AFTER_DEFAULT) -> float:
    """Seconds to wait, from a number (or timedelta) a peer sent (any JSON value, or a
    header's text); not a number → `default`."""
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, bool):
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if math.isnan(seconds):
        return default
    return min(max(seconds, RETRY_AFTER_MIN), RETRY_AFTER_MAX)


def retry_after_header(value: str | None, default: float = RETRY_AFTER_DEFAULT) -> float:
    """An HTTP Retry-After header: delay-seconds or an HTTP date."""
    if value is None:
        return default
    try:
        return clamp_retry_after(float(value), default)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return default
    return clamp_retry_after(when.timestamp() - time.time(), default)
