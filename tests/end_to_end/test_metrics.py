"""GET /metrics over real HTTP from a real web server, with a real worker beside it: each
value is what the test caused (a burst of 3 → one turn of 3 messages; one duplicate → 1;
one labelled resend → 1), the worker's counts read through the web process
(prometheus-client's multiprocess mode), and only staff and the token may read them."""

import sqlite3
import time

import httpx
import pytest
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from agentloop.console.roles import OPERATORS, ensure_roles
from audit.models import AuditEvent, EventKind
from conversations.models import Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import is_postgres, wait_until
from tests.support import local_http
from tests.support.e2e import send, telegram_channel

pytestmark = pytest.mark.e2e
TOKEN = "metrics-token-for-tests"
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}


def scrape(web, token=TOKEN) -> dict:
    """{(name, frozenset(labels)): value} of every sample."""
    response = local_http.get(f"{web.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def test_a_burst_a_duplicate_and_a_delivery_are_counted_across_processes(processes, make_channel, agent_key,
                                                                          fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram)
    key = agent_key(channel)
    web, _ = processes.web(wait=False, AGENTLOOP_METRICS_TOKEN=TOKEN), processes.worker()
    before = scrape(web)
    assert value(before, "agentloop_workers_alive") == 1
    assert value(before, "agentloop_database_up") == 1
    assert value(before, "agentloop_messages_per_turn_count") == 0

    for text in ["Confirmo las horas de psicología y", "también la de kine y", "la del dentista y"]:
        send(web, "tg", 101, text)
    wait_until(lambda: value(scrape(web), "agentloop_buffers_open") == 1, message="the burst's buffer open")
    fake_telegram.wait_for("sendMessage", timeout=15)
    wait_until(delivered(1), message="the reply delivered")

    body = {"scope": "ana", "arguments": EVENT}
    for expected in ("done", "duplicate"):
        answer = local_http.post(f"{web.url}/api/v1/tools/calendar_create_event/invoke", json=body, timeout=30,
                                 headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200 and answer.json()["status"] == expected, answer.text

    assert Turn.objects.count() == 1
    after = scrape(web)
    # The flush, the turn and the send happened in the worker; the web reads them.
    assert value(after, "agentloop_turns_flushed_total", reason="window") == 1
    assert value(after, "agentloop_bursts_merged_total") == 1
    assert value(after, "agentloop_messages_per_turn_count") == 1
    assert value(after, "agentloop_messages_per_turn_sum") == 3
    assert value(after, "agentloop_messages_per_turn_bucket", le="2.0") == 0
    assert value(after, "agentloop_messages_per_turn_bucket", le="3.0") == 1
    assert value(after, "agentloop_turn_duration_seconds_count", state="done") == 1
    assert value(after, "agentloop_reply_attempts_total", outcome="delivered") == 1
    assert value(after, "agentloop_delivery_latency_seconds_count") == 1
    assert value(after, "agentloop_replies_recovered_total") == 0
    # The guard ran in the web process: one action let through, one duplicate caught.
    assert value(after, "agentloop_actions_claimed_total", tool="calendar_create_event") == 1
    assert value(after, "agentloop_duplicates_prevented_total", tool="calendar_create_event",
                 status="duplicate") == 1
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 1
    assert value(after, "agentloop_buffers_open") == 0
    assert value(after, "agentloop_turns_ready") == 0
    assert value(after, "agentloop_replies_owed") == 0


def test_a_labelled_resend_is_counted_recovered_and_a_killed_worker_is_gone(processes, make_channel,
                                                                            fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web = processes.web(AGENTLOOP_METRICS_TOKEN=TOKEN)
    hold = fake_telegram.hold("sendMessage")
    worker = processes.worker()
    send(web, "tg", 101, "¿Me confirmas la hora?")
    hold.wait_held(1, timeout=15)  # the platform has the request; no answer yet
    worker.kill()
    hold.release()
    assert value(scrape(web), "agentloop_workers_alive") == 0  # its process is gone from this host
    assert value(scrape(web), "agentloop_replies_owed") == 1

    processes.worker()
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    wait_until(delivered(1), message="the row delivered labelled")
    assert fake_telegram.calls("sendMessage")[-1].params["text"].startswith(ledger.RECOVERY_PREFIX)
    samples = scrape(web)
    assert value(samples, "agentloop_replies_recovered_total") == 1
    assert value(samples, "agentloop_reply_attempts_total", outcome="delivered") == 1
    # The killed worker's flush is still counted (its files stay; only live gauges go).
    assert value(samples, "agentloop_turns_flushed_total", reason="window") == 1
    assert value(samples, "agentloop_workers_alive") == 1


def session_cookie(user) -> str:
    """A logged-in session for `user`, as a login would leave it (the admin's login
    refuses anyone who is not staff)."""
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def test_only_staff_with_the_permission_and_the_token_may_read(processes):
    ensure_roles()
    users = get_user_model().objects
    operator = users.create_user("olga", password="x-long-password", is_staff=True)
    operator.groups.add(Group.objects.get(name=OPERATORS))
    staff_without_role = users.create_user("sam", password="x-long-password", is_staff=True)
    customer = users.create_user("carla", password="x-long-password")
    web = processes.web(AGENTLOOP_METRICS_TOKEN=TOKEN)

    def get(headers=None, user=None):
        cookies = {"sessionid": session_cookie(user)} if user is not None else None
        return httpx_get(f"{web.url}/metrics", headers=headers or {}, cookies=cookies)

    anonymous = get()
    assert anonymous.status_code == 401 and "Bearer" in anonymous.json()["error"]
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert get(user=customer).status_code == 403
    assert "not allowed" in get(user=customer).json()["error"]
    assert get(user=staff_without_role).status_code == 403
    as_operator = get(user=operator)
    assert as_operator.status_code == 200 and "agentloop_workers_alive" in as_operator.text
    assert get({"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    for wrong in (f"Bearer {TOKEN}x", "Bearer", f"Basic {TOKEN}", "Bearer ñ"):
        refused = get({"Authorization": wrong.encode()})
        assert refused.status_code == 401 and "token" in refused.json()["error"], wrong


def test_without_a_token_configured_no_bearer_is_accepted(processes):
    web = processes.web()
    assert local_http.get(f"{web.url}/metrics", headers={"Authorization": "Bearer"}).status_code == 401
    assert local_http.get(f"{web.url}/metrics", headers={"Authorization": "Bearer x"}).status_code == 401


def httpx_get(url, headers, cookies):
    """Cookies per request: the shared client (tests.support.local_http) keeps none."""
    with httpx.Client(timeout=5.0, trust_env=False, cookies=cookies) as client:
        return client.get(url, headers=headers)


def test_with_the_ledger_off_a_send_is_still_counted_by_outcome(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web = processes.web(wait=False, AGENTLOOP_METRICS_TOKEN=TOKEN)
    processes.worker(AGENTLOOP_DELIVERY_LEDGER="false")
    fake_telegram.fail_next("sendMessage", status=400, description="Bad Request: chat not found")
    send(web, "tg", 101, "¿Hola?")
    fake_telegram.wait_for("sendMessage", timeout=15)
    wait_until(lambda: value(scrape(web), "agentloop_replies_abandoned_total") == 1, message="the lost reply counted")
    samples = scrape(web)
    assert value(samples, "agentloop_reply_attempts_total", outcome="permanent") == 1
    assert value(samples, "agentloop_reply_attempts_total", outcome="delivered") == 0
    assert not OutboundMessage.objects.exists()


def test_a_database_fault_is_counted_with_its_time(processes, make_channel, fake_telegram):
    """SQLite's write lock held by another connection past the worker's SQLITE_TIMEOUT: the
    worker's flush fails, retries, and gets through once the lock is let go."""
    if is_postgres():
        pytest.skip("the lock is SQLite's; PostgreSQL's outages are tests/end_to_end/test_faults_database.py's")
    telegram_channel(make_channel, fake_telegram)
    web = processes.web(wait=False, AGENTLOOP_METRICS_TOKEN=TOKEN)
    processes.worker(SQLITE_TIMEOUT="0.3")
    send(web, "tg", 101, "¿Hola?")  # due in 1.2 s
    lock = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        # The scrape only reads: WAL lets it, while the worker cannot write. Waited for on the
        # fault counter, not on the failing gauge: on SQLite the worker's reads succeed
        # beside the lock and end each fault until its next write fails, so the gauge flips
        # between 1 and 0 and a scrape on a saturated machine can miss every 1 (the gauge's
        # transitions: tests/unit/test_metrics_dir.py).
        wait_until(lambda: value(scrape(web), "agentloop_database_faults_total") >= 1, timeout=20,
                   message="the worker's first database fault")
        time.sleep(1.0)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    fake_telegram.wait_for("sendMessage", timeout=15)
    wait_until(lambda: value(scrape(web), "agentloop_database_failing") == 0, message="the worker back")
    samples = scrape(web)
    assert value(samples, "agentloop_database_faults_total") >= 1
    # A fault ends at the next step that succeeds (as the worker's log says "back after"): on
    # SQLite the flusher's reads go on beside the lock, so only the gaps after failed writes count.
    assert value(samples, "agentloop_database_fault_seconds_total") > 0
    assert value(samples, "agentloop_database_up") == 1
