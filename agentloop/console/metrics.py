"""GET /metrics: Prometheus' text format, for a staff login with the `view_metrics`
permission (operators and auditors have it) or for `Authorization: Bearer
<AGENTLOOP_METRICS_TOKEN>`; nobody else.

The counters and histograms come from every process of this host (their files in
AGENTLOOP_METRICS_DIR, summed: agentloop.core.metrics_dir); the depths and the workers
alive are read from the database at scrape time, each a bounded count on an index
(at most CAP rows read: a figure at the cap means at least that many). With the database
away the scrape still answers, with `agentloop_database_up 0`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from agentloop.core import metrics_dir
from agentloop.core.db_connection import close_broken_connection
from conversations import engine
from conversations.models import BufferState, MessageBuffer, Turn, TurnState, WorkerHeartbeat
from delivery.models import OutboundMessage

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django.http import HttpRequest

log = logging.getLogger(__name__)

PERMISSION = "agentloop.view_metrics"
CAP = 10_000
ASK = "log in as staff with the view_metrics permission, or send Authorization: Bearer <AGENTLOOP_METRICS_TOKEN>"


def metrics(request: HttpRequest) -> HttpResponse:
    refused = refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(scrape(), content_type=CONTENT_TYPE_LATEST)


def refusal(request: HttpRequest) -> JsonResponse | None:
    """None if the request may read the metrics, else the answer: 401 (no or a wrong
    credential) or 403 (logged in, but not allowed)."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        expected = settings.AGENTLOOP_METRICS_TOKEN
        if scheme.lower() == "bearer" and expected and hmac.compare_digest(token.strip().encode(), expected.encode()):
            return None
        return _refused(401, "wrong or unknown metrics token")
    user = request.user
    if not user.is_authenticated:
        return _refused(401, f"authentication required: {ASK}")
    if not (user.is_active and user.is_staff and user.has_perm(PERMISSION)):
        return _refused(403, f"not allowed: {ASK}")
    return None


def _refused(status: int, error: str) -> JsonResponse:
    response = JsonResponse({"ok": False, "error": error}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def scrape() -> bytes:
    directory = settings.AGENTLOOP_METRICS_DIR
    if directory is None:  # a process outside the product's (runserver's reloader, a test run)
        processes = REGISTRY
    else:
        metrics_dir.forget_the_dead(directory)
        processes = CollectorRegistry()
        MultiProcessCollector(processes, path=str(directory))  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    return generate_latest(processes) + generate_latest(DATABASE)


def bounded_count(queryset: QuerySet[Any]) -> int:
    return queryset[:CAP].count()


def figures() -> list[tuple[str, str, int]]:
    """(name, help, value) read from the database now."""
    dead = engine.dead_owners()
    return [
        ("agentloop_buffers_open", "Buffers open: conversations with messages waiting for their window to close.",
         bounded_count(MessageBuffer.objects.filter(state=BufferState.OPEN))),
        ("agentloop_turns_ready", "Turns ready, waiting for a worker (the queue).",
         bounded_count(Turn.objects.filter(state=TurnState.READY))),
        ("agentloop_turns_running", "Turns running now.", bounded_count(Turn.objects.filter(state=TurnState.RUNNING))),
        ("agentloop_replies_owed", "Ledger rows still owed to a user (pending, being sent, or failed and to be "
         "retried).", bounded_count(OutboundMessage.objects.filter(state__in=OutboundMessage.OPEN))),
        ("agentloop_workers_alive", "Worker loops alive (their liveness lock held or their heartbeat fresh).",
         max(0, WorkerHeartbeat.objects.count() - len(dead))),
    ]


class DatabaseFigures:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            found, up = figures(), 1
        except DatabaseError as exc:
            log.warning("metrics: the database figures could not be read: %s", type(exc).__name__)
            close_broken_connection()
            found, up = [], 0
        yield GaugeMetricFamily("agentloop_database_up", "1 if the scrape could read the database figures.", value=up)
        for name, text, value in found:
            yield GaugeMetricFamily(name, text, value=value)


DATABASE = CollectorRegistry(auto_describe=False)
DATABASE.register(DatabaseFigures())
