"""Signatures on what we POST to other services (api channels' callbacks, webhook agents).

    X-Agentloop-Timestamp: <unix seconds>
    X-Agentloop-Signature: sha256=<hex HMAC-SHA256 over f"{timestamp}.{body}", key = the secret>

The timestamp is signed with the body so a captured request cannot be replayed later: a
receiver recomputes the HMAC over the timestamp header, a dot and the raw body, compares
in constant time, and refuses a timestamp more than REPLAY_WINDOW seconds away from its
own clock (`verify` below is that check, for receivers written in Python).
"""

import hashlib
import hmac
import time
from collections.abc import Mapping

REPLAY_WINDOW = 300  # seconds


def signature(secret: str, timestamp: str, body: bytes) -> str:
    message = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if now is None else now))
    return {"X-Agentloop-Timestamp": timestamp, "X-Agentloop-Signature": signature(secret, timestamp, body)}


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None,
           window: float = REPLAY_WINDOW) -> bool:
    """A receiver's check: the signature matches and the timestamp is recent."""
    timestamp = headers.get("X-Agentloop-Timestamp", "")
    given = headers.get("X-Agentloop-Signature", "")
    # Headers are whatever the sender chose: compare_digest raises TypeError on a non-ASCII
    # str (a receiver would answer 500), and int() accepts any script's digits.
    if not (timestamp.isascii() and timestamp.isdigit() and given.isascii()):
        return False
    age = abs((time.time() if now is None else now) - int(timestamp))
    return age <= window and hmac.compare_digest(given.encode(), signature(secret, timestamp, body).encode())
