"""`Idempotency-Key` on every POST of the REST API (draft-ietf-httpapi-idempotency-key-header),
one implementation for every app's views: they derive from `ApiView`.

A client that retries a POST after a timeout sends the same key; the first request with
that key (per caller: an agent key, or an operator) runs, the others do not:

- the same key and the same request (a SHA-256 of method, path and body) within
  `KEEP` replays the first answer — status, body, Content-Type and Location — with
  `Idempotent-Replayed: true`, without running the view;
- the same key with another request → 422; a key whose first request is still running
  → 409 (with Retry-After); an empty key or one over 255 characters → 400;
- a 5xx (or a crash) is not kept: the key is free again and the client may retry. A 4xx
  is kept and replayed, as Stripe does: the same request would get the same answer.

The key is claimed by INSERTing its row before the view runs: the unique (owner, key)
pair makes one claim win across processes and hosts, without a lock held for the
request's length. A process killed mid-request leaves its row in flight: after `LEASE` a
new request with that key takes it over. The retention sweep deletes rows after `KEEP`
(`prune`). Answers of 401/403/429 (before the claim) are never kept.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework import exceptions  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.views import APIView  # type: ignore[import-untyped]

from agentloop.core import pruning
from agentloop.core.models import IdempotentRequest

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]
    from rest_framework.response import Response  # type: ignore[import-untyped]

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
KEEP = timedelta(hours=24)
# Longer than any API request runs (an erasure waits 10 s, a hosted tool its policy's
# timeout): a live request never loses its key to a retry, a dead one frees it soon.
LEASE = timedelta(seconds=120)
REPLAYED_HEADERS = ("Content-Type", "Location")  # what a replay repeats besides status and body
# What a key may be, the schema's pattern too (conversations/schema.py): a bare token as
# Stripe takes it (printable ASCII, no space at either end, not starting with a quote), or
# the draft's structured-field string ("…", with \" and \\ escapes), 1 to 255 characters.
KEY_PATTERN = (r'^(?:[!#-~](?:[ -~]{0,253}[!-~])?'
               r'|"(?:[ !#-\[\]-~]|\\["\\]){1,%d}")$' % MAX_KEY_CHARS)
_KEY = re.compile(KEY_PATTERN)


class BadKey(exceptions.APIException):  # type: ignore[misc]  # DRF's classes are Any here
    status_code = 400


class KeyInFlight(exceptions.APIException):  # type: ignore[misc]
    status_code = 409
    default_detail = "a request with this Idempotency-Key is still in flight: retry later"


class KeyReused(exceptions.APIException):  # type: ignore[misc]
    status_code = 422
    default_detail = "this Idempotency-Key was used for another request (another method, path or body)"


class Replayed(Exception):
    """Raised out of the view's `initial` to answer with a kept response instead."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__("replayed")
        self.response = response


def key_of(request: Request) -> str | None:
    """The request's key (None without the header), or BadKey."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not _KEY.fullmatch(raw):
        raise BadKey(f"{HEADER} must be 1 to {MAX_KEY_CHARS} printable ASCII characters, bare or as a quoted "
                     "string")
    return re.sub(r'\\(["\\])', r"\1", raw[1:-1]) if raw.startswith('"') else raw


def owner_of(request: Request) -> str:
    """Whose key: an agent key's or a user's row (keys are per caller)."""
    user = request.user
    return f"{user._meta.label_lower}:{user.pk}"[:100]


def capture_body(request: Request) -> None:
    """Keep a JSON body's raw bytes readable for the fingerprint: read here, before DRF's
    parser (or a session's CSRF check) consumes the stream; Django then serves the parser
    from the copy. A multipart body (an upload, maybe large) is fingerprinted from its
    parsed parts instead."""
    if not _multipart(request):
        request._request.body  # noqa: B018 -- the read caches it


def fingerprint(request: Request) -> str:
    digest = hashlib.sha256(f"{request.method} {request.get_full_path()}\n".encode())
    if not _multipart(request):
        digest.update(request._request.body)
        return digest.hexdigest()
    for name in sorted(request.data.keys()):
        for value in request.data.getlist(name):
            digest.update(f"\n{name}=".encode())
            if hasattr(value, "chunks"):
                for chunk in value.chunks():
                    digest.update(chunk)
                value.seek(0)
            else:
                digest.update(str(value).encode())
    return digest.hexdigest()


def _multipart(request: Request) -> bool:
    return bool(request.content_type.startswith("multipart/"))


def claim(owner: str, key: str, print_: str) -> IdempotentRequest:
    """The key's row, claimed for this request; or Replayed, KeyInFlight, KeyReused."""
    now = timezone.now()
    try:
        with transaction.atomic():
            return IdempotentRequest.objects.create(owner=owner, key=key, fingerprint=print_, created_at=now,
                                                    lease_until=now + LEASE)
    except IntegrityError:
        pass
    kept = IdempotentRequest.objects.filter(owner=owner, key=key).first()
    if kept is None or kept.created_at <= now - KEEP or (
            kept.status is None and kept.lease_until <= now):  # type: ignore[operator]  # in flight: leased
        return _take_over(owner, key, print_, kept, now)  # gone, expired, or its request died
    if kept.fingerprint != print_:
        raise KeyReused()
    if kept.status is None:
        raise KeyInFlight()
    raise Replayed(replay(kept))


def _take_over(owner: str, key: str, print_: str, kept: IdempotentRequest | None,
               now: datetime) -> IdempotentRequest:
    """A key whose row expired (or whose request died) is claimed again by a compare-and-set
    on the row as it was read: of two retries taking it over at once, one wins; the other
    is told the key is in flight."""
    if kept is None:
        return claim(owner, key, print_)  # pruned between the INSERT and the read: INSERT again
    fresh = dict(fingerprint=print_, created_at=now, lease_until=now + LEASE, status=None, content=b"", headers={})
    won = IdempotentRequest.objects.filter(pk=kept.pk, created_at=kept.created_at).update(**fresh)
    if not won:
        raise KeyInFlight()
    return IdempotentRequest(pk=kept.pk, owner=owner, key=key, **fresh)


def replay(kept: IdempotentRequest) -> HttpResponse:
    response = HttpResponse(bytes(kept.content), status=kept.status)
    for name, value in kept.headers.items():
        response[name] = value
    response["Idempotent-Replayed"] = "true"
    return response


def keep(claimed: IdempotentRequest, response: HttpResponse) -> None:
    """Store the first answer on the claimed row (still ours: claimed at the same instant);
    a 5xx frees the key instead, so the client's retry runs."""
    mine = IdempotentRequest.objects.filter(pk=claimed.pk, created_at=claimed.created_at, status__isnull=True)
    if response.status_code >= 500:
        mine.delete()
        return
    if hasattr(response, "render"):
        response.render()
    headers = {name: response[name] for name in REPLAYED_HEADERS if response.has_header(name)}
    mine.update(status=response.status_code, content=response.content, headers=headers, lease_until=None)


def release(claimed: IdempotentRequest) -> None:
    IdempotentRequest.objects.filter(pk=claimed.pk, created_at=claimed.created_at, status__isnull=True).delete()


class ApiView(APIView):  # type: ignore[misc]  # DRF's classes are Any here
    """An API view whose POSTs honour `Idempotency-Key` (this module's docstring). The key
    is read after authentication, permissions and the rate limit: an answer to a request
    that was never let in is not kept."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if request.method == "POST" and HEADER in request.headers:
            capture_body(request)
        super().initial(request, *args, **kwargs)
        if request.method != "POST":
            return
        key = key_of(request)
        if key is not None:
            request.idempotency_claim = claim(owner_of(request), key, fingerprint(request))

    def handle_exception(self, exc: Exception) -> HttpResponse | Response:
        if isinstance(exc, Replayed):
            return exc.response
        if isinstance(exc, KeyInFlight):
            response = super().handle_exception(exc)
            response["Retry-After"] = "1"
            return response
        return super().handle_exception(exc)

    def raise_uncaught_exception(self, exc: Exception) -> None:
        claimed = getattr(self.request, "idempotency_claim", None)
        if claimed is not None:
            release(claimed)  # a crash is a 5xx: the client may retry
            self.request.idempotency_claim = None
        super().raise_uncaught_exception(exc)

    def finalize_response(self, request: Request, response: HttpResponse, *args: Any,
                          **kwargs: Any) -> HttpResponse:
        response = super().finalize_response(request, response, *args, **kwargs)
        claimed = getattr(request, "idempotency_claim", None)
        if claimed is not None:
            request.idempotency_claim = None
            keep(claimed, response)
        return response


def prune(now: datetime, budget: pruning.Budget) -> int:
    """Keys older than KEEP (the retention sweep, in batches: agentloop.core.pruning)."""
    cutoff = now - KEEP
    return pruning.delete_old(IdempotentRequest, "created_at", cutoff,
                              IdempotentRequest.objects.filter(created_at__lt=cutoff), budget)
