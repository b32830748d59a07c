"""The CalDAV calendar backend against a real Radicale server (a subprocess).

Every test checks what is on the server with an independent caldav client, not only
what the backend says about itself. Each test works in its own calendar (named after the
test), so the module-wide server needs no cleaning between tests.
"""

import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import caldav
import pytest
from caldav.lib import error as dav_error

from tests.conftest import free_port
from tests.fakes.radicale_server import RadicaleServer, SwallowingProxy
from tools import guard, registry
from tools.builtin import caldav as caldav_backend
from tools.builtin.calendar import EventData, backend
from tools.registry import OutcomeUnknown, Scope, ToolCall, ToolError

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def radicale(tmp_path_factory):
    """A real Radicale server for the whole module: .url, .username, .password."""
    with RadicaleServer(tmp_path_factory.mktemp("radicale")) as server:
        yield server


def point_at(settings, server, calendar):
    settings.AGENTLOOP_CALENDAR_BACKEND = "caldav"
    settings.AGENTLOOP_CALDAV_URL = server.url
    settings.AGENTLOOP_CALDAV_USERNAME = server.username
    settings.AGENTLOOP_CALDAV_PASSWORD = server.password
    settings.AGENTLOOP_CALDAV_CALENDAR = calendar
    settings.AGENTLOOP_CALDAV_TIMEOUT = 3
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "Europe/Madrid"


@pytest.fixture
def calendar_name(settings, radicale, request):
    """Points the backend at Radicale, in a calendar of this test's own."""
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    point_at(settings, radicale, name)
    yield name
    caldav_backend.forget_connections()


class Server:
    """An independent view of the server (a fresh client, not the backend's)."""

    def __init__(self, radicale, calendar_name):
        self.client = caldav.DAVClient(url=radicale.url, username=radicale.username, password=radicale.password,
                                       timeout=5)
        self.calendar = self.client.principal().calendar(name=calendar_name)

    def event(self, uid):
        """The VEVENT with this UID, or None."""
        try:
            return self.calendar.get_event_by_uid(uid).icalendar_component
        except dav_error.NotFoundError:
            return None

    def uids(self):
        return sorted(str(e.icalendar_component["UID"]) for e in self.calendar.search(event=True))


@pytest.fixture
def server(radicale, calendar_name):
    def view():
        return Server(radicale, calendar_name)

    return view


def run(tool_name, arguments, scope_key, key=""):
    call = ToolCall(arguments=arguments, scope=Scope(scope_key), idempotency_key=key)
    return registry.get(tool_name).run(call)


def create(arguments, scope_key="contact:1", key="agentloop-claim-1"):
    return run("calendar_create_event", arguments, scope_key, key)


def test_create_event_lands_on_the_server(calendar_name, server):
    result = create({"title": "  Dentist ", "start_datetime": "2030-01-15T10:30", "attendees": ["ana@example.com"],
                     "location": "Calle Mayor 1", "description": "Check-up"})

    uid = "agentloop-claim-1@agentloop"
    assert result["event_id"] == uid
    assert result["title"] == "Dentist"
    assert result["calendar"] == calendar_name
    event = server().event(uid)
    assert event is not None
    assert str(event["SUMMARY"]) == "Dentist"
    # A naive start is Madrid time: 10:30 CET (UTC+1 in January) is 09:30 UTC.
    assert event["DTSTART"].dt == datetime(2030, 1, 15, 9, 30, tzinfo=UTC)
    assert event["DTSTART"].dt.utcoffset().total_seconds() == 0
    assert event["DTEND"].dt == datetime(2030, 1, 15, 10, 30, tzinfo=UTC)  # default: one hour
    assert str(event["ATTENDEE"]) == "mailto:ana@example.com"
    assert str(event["LOCATION"]) == "Calle Mayor 1"
    assert str(event["DESCRIPTION"]) == "Check-up"
    assert str(event["X-AGENTLOOP-SCOPE"]) == "contact:1"


def test_explicit_time_zone_and_summer_time(calendar_name, server):
    create({"title": "Call", "start_datetime": "2030-07-01T18:00+02:00", "end_datetime": "2030-07-01T19:15"})
    event = server().event("agentloop-claim-1@agentloop")
    assert event["DTSTART"].dt == datetime(2030, 7, 1, 16, 0, tzinfo=UTC)
    assert event["DTEND"].dt == datetime(2030, 7, 1, 17, 15, tzinfo=UTC)  # naive: Madrid, CEST


def test_list_sees_only_the_scopes_events(calendar_name, server):
    create({"title": "Late", "start_datetime": "2030-03-02T12:00"}, "contact:1", "agentloop-claim-11")
    create({"title": "Early", "start_datetime": "2030-03-01T12:00"}, "contact:1", "agentloop-claim-12")
    create({"title": "Someone else's", "start_datetime": "2030-03-01T13:00"}, "contact:2", "agentloop-claim-13")
    create({"title": "Prefix trap", "start_datetime": "2030-03-01T14:00"}, "contact:12", "agentloop-claim-14")
    create({"title": "Long ago", "start_datetime": "2020-03-01T12:00"}, "contact:1", "agentloop-claim-15")
    assert len(server().uids()) == 5

    listed = run("calendar_list_events", {}, "contact:1")  # default: from now on
    assert [e["title"] for e in listed["events"]] == ["Early", "Late"]
    assert listed["count"] == 2
    assert listed["events"][0]["event_id"] == "agentloop-claim-12@agentloop"
    assert listed["events"][0]["start"] == "2030-03-01T11:00:00+00:00"

    other = run("calendar_list_events", {}, "contact:2")
    assert [e["title"] for e in other["events"]] == ["Someone else's"]

    window = run("calendar_list_events", {"start_from": "2019-01-01", "start_to": "2030-03-02T00:00"}, "contact:1")
    assert [e["title"] for e in window["events"]] == ["Long ago", "Early"]
    assert run("calendar_list_events", {}, "contact:3") == {"events": [], "count": 0}


def test_list_is_limited_and_sorted(calendar_name):
    for day in (5, 3, 4, 1, 2):
        create({"title": f"Day {day}", "start_datetime": f"2030-05-0{day}T09:00"}, key=f"agentloop-claim-{day}")
    events = backend().list(Scope("contact:1"), None, None, limit=3)
    assert [e["title"] for e in events] == ["Day 1", "Day 2", "Day 3"]


def test_reconcile_finds_the_created_event_by_its_claim(calendar_name):
    tool = registry.get("calendar_create_event")
    call = ToolCall(arguments={"title": "Haircut", "start_datetime": "2030-02-01T09:00"}, scope=Scope("contact:1"),
                    idempotency_key="agentloop-claim-7")
    tool.run(call)

    found = tool.reconcile(call)
    assert found["event_id"] == "agentloop-claim-7@agentloop"
    assert found["title"] == "Haircut"
    assert found["start"] == "2030-02-01T08:00:00+00:00"
    assert found["end"] == "2030-02-01T09:00:00+00:00"
    assert found["calendar"] == calendar_name

    never = ToolCall(arguments=call.arguments, scope=Scope("contact:1"), idempotency_key="agentloop-claim-8")
    assert tool.reconcile(never) is None
    # Another scope does not see it either.
    assert tool.reconcile(ToolCall(arguments=call.arguments, scope=Scope("contact:2"),
                                   idempotency_key="agentloop-claim-7")) is None


def test_delete_event(calendar_name, server):
    uid = create({"title": "Meeting", "start_datetime": "2030-04-01T10:00"})["event_id"]

    with pytest.raises(ToolError, match="no event"):
        run("calendar_delete_event", {"event_id": uid}, "contact:2")
    assert server().event(uid) is not None  # another scope cannot delete it

    assert run("calendar_delete_event", {"event_id": uid}, "contact:1") == {"deleted": uid}
    assert server().event(uid) is None

    with pytest.raises(ToolError, match="no event"):
        run("calendar_delete_event", {"event_id": uid}, "contact:1")
    with pytest.raises(ToolError, match="no event 'nope@agentloop'"):
        run("calendar_delete_event", {"event_id": "nope@agentloop"}, "contact:1")
    delete = registry.get("calendar_delete_event")
    assert delete.reconcile(ToolCall(arguments={"event_id": uid}, scope=Scope("contact:1"))) == {"deleted": uid}


def test_create_does_not_overwrite_another_scopes_event(calendar_name, server):
    create({"title": "Mine", "start_datetime": "2030-06-01T10:00"}, "contact:1", "agentloop-claim-3")
    # The same UID again in the same scope: it already happened; the original stands.
    again = create({"title": "Mine (again)", "start_datetime": "2030-06-01T10:00"}, "contact:1", "agentloop-claim-3")
    assert again["title"] == "Mine"
    with pytest.raises(ToolError, match="another event"):
        create({"title": "Theirs", "start_datetime": "2030-06-01T10:00"}, "contact:2", "agentloop-claim-3")
    event = server().event("agentloop-claim-3@agentloop")
    assert str(event["SUMMARY"]) == "Mine"
    assert str(event["X-AGENTLOOP-SCOPE"]) == "contact:1"


def test_the_calendar_is_created_once_and_then_reused(calendar_name, radicale):
    create({"title": "One", "start_datetime": "2030-06-01T10:00"}, key="agentloop-claim-1")
    caldav_backend.forget_connections()  # as a fresh process or thread would
    create({"title": "Two", "start_datetime": "2030-06-02T10:00"}, key="agentloop-claim-2")
    client = caldav.DAVClient(url=radicale.url, username=radicale.username, password=radicale.password)
    names = [c.get_display_name() for c in client.principal().calendars()]
    assert names.count(calendar_name) == 1


def test_threads_creating_at_once_share_one_calendar(calendar_name, radicale, server):
    """Worker threads each get their own client; racing to create the calendar makes one."""
    def work(n):
        data = EventData(title=f"Thread {n}", start=datetime(2030, 11, 1, 9, n, tzinfo=UTC))
        return backend().create(Scope("contact:1"), f"agentloop-claim-{100 + n}@agentloop", data)["event_id"]

    with ThreadPoolExecutor(6) as pool:
        created = list(pool.map(work, range(6)))
    assert server().uids() == sorted(created)
    client = caldav.DAVClient(url=radicale.url, username=radicale.username, password=radicale.password)
    assert [c.get_display_name() for c in client.principal().calendars()].count(calendar_name) == 1


def test_server_down_is_a_tool_error(settings, tmp_path):
    with RadicaleServer(tmp_path / "radicale") as down:
        point_at(settings, down, "agentloop")
        create({"title": "Before", "start_datetime": "2030-06-01T10:00"})  # the client is warm and cached
    try:
        started = time.monotonic()
        with pytest.raises(ToolError, match="refused the connection"):
            create({"title": "After", "start_datetime": "2030-06-01T11:00"}, key="agentloop-claim-2")
        with pytest.raises(ToolError, match="refused the connection"):
            run("calendar_list_events", {}, "contact:1")
        assert time.monotonic() - started < 10
        with down:  # back up: the backend recovers on its own
            assert [e["title"] for e in run("calendar_list_events", {}, "contact:1")["events"]] == ["Before"]
    finally:
        caldav_backend.forget_connections()


def test_closed_port_is_a_tool_error(settings, radicale):
    point_at(settings, radicale, "agentloop")
    settings.AGENTLOOP_CALDAV_URL = f"http://127.0.0.1:{free_port()}/"
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"calendar server at http://127\.0\.0\.1:\d+/ refused the connection"):
        create({"title": "Nowhere", "start_datetime": "2030-06-01T10:00"})
    assert time.monotonic() - started < 5


def test_a_caldav_error_never_quotes_the_urls_credentials(settings, radicale):
    """AGENTLOOP_CALDAV_URL may carry its credentials (`https://user:password@host/`): the
    error goes to the model, an invoke answer and a note, so it must not quote them."""
    point_at(settings, radicale, "agentloop")
    settings.AGENTLOOP_CALDAV_URL = f"http://alice:Dav-Passw0rd-x81@127.0.0.1:{free_port()}/dav/?token=tk-Dav-55x"
    with pytest.raises(ToolError, match="refused the connection") as refused:
        create({"title": "Nowhere", "start_datetime": "2030-06-01T10:00"})
    for secret in ("Dav-Passw0rd-x81", "tk-Dav-55x", "alice"):
        assert secret not in str(refused.value), str(refused.value)


def test_silent_server_times_out_as_a_tool_error(settings, radicale):
    point_at(settings, radicale, "agentloop")
    settings.AGENTLOOP_CALDAV_TIMEOUT = 1
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings.AGENTLOOP_CALDAV_URL = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        started = time.monotonic()
        with pytest.raises(ToolError, match="did not answer in time"):
            create({"title": "Hello?", "start_datetime": "2030-06-01T10:00"})
        assert time.monotonic() - started < 5


def test_empty_username_sends_no_credentials(settings, radicale, calendar_name):
    settings.AGENTLOOP_CALDAV_USERNAME = ""  # no auth at all: this server wants some, so it refuses
    with pytest.raises(ToolError, match=r"refused our credentials or access \(HTTP 401\)"):
        create({"title": "Anonymous", "start_datetime": "2030-06-01T10:00"})


def test_wrong_password_is_a_tool_error(settings, radicale, calendar_name):
    settings.AGENTLOOP_CALDAV_PASSWORD = "wrong"
    with pytest.raises(ToolError, match="refused our credentials"):
        create({"title": "Intruder", "start_datetime": "2030-06-01T10:00"})


def test_lost_answer_to_the_put_is_outcome_unknown_and_reconciles(settings, radicale, calendar_name, server):
    settings.AGENTLOOP_CALDAV_TIMEOUT = 1
    with SwallowingProxy(radicale.port, swallow=("PUT",)) as proxy:
        settings.AGENTLOOP_CALDAV_URL = proxy.url
        data = EventData(title="Lost answer", start=datetime(2030, 8, 1, 10, tzinfo=UTC))
        with pytest.raises(OutcomeUnknown, match="did not answer in time while the PUT request was in flight"):
            backend().create(Scope("contact:1"), "agentloop-claim-5@agentloop", data)
        assert proxy.swallowed == 1
        # It did happen; looking the UID up (through the same proxy) says so.
        found = backend().find(Scope("contact:1"), "agentloop-claim-5@agentloop")
    assert found["title"] == "Lost answer"
    assert server().event("agentloop-claim-5@agentloop") is not None


def test_dropped_connection_during_the_put_is_outcome_unknown(settings, radicale, calendar_name, server):
    with SwallowingProxy(radicale.port, swallow=("PUT",), hang_up=True) as proxy:
        settings.AGENTLOOP_CALDAV_URL = proxy.url
        data = EventData(title="Dropped", start=datetime(2030, 8, 2, 10, tzinfo=UTC))
        with pytest.raises(OutcomeUnknown, match="closed connection without response"):
            backend().create(Scope("contact:1"), "agentloop-claim-6@agentloop", data)
    assert server().event("agentloop-claim-6@agentloop") is not None


def test_lost_answer_to_the_delete_is_outcome_unknown(settings, radicale, calendar_name, server):
    uid = create({"title": "To go", "start_datetime": "2030-08-03T10:00"})["event_id"]
    settings.AGENTLOOP_CALDAV_TIMEOUT = 1
    with SwallowingProxy(radicale.port, swallow=("DELETE",)) as proxy:
        settings.AGENTLOOP_CALDAV_URL = proxy.url
        with pytest.raises(OutcomeUnknown, match="DELETE request was in flight"):
            run("calendar_delete_event", {"event_id": uid}, "contact:1")
        delete = registry.get("calendar_delete_event")
        assert delete.reconcile(ToolCall(arguments={"event_id": uid}, scope=Scope("contact:1"))) == {"deleted": uid}
    assert server().event(uid) is None


def test_lost_answer_through_the_guard_is_reconciled_as_done(settings, radicale, calendar_name, server):
    settings.AGENTLOOP_CALDAV_TIMEOUT = 1
    with SwallowingProxy(radicale.port, swallow=("PUT",)) as proxy:
        settings.AGENTLOOP_CALDAV_URL = proxy.url
        outcome = guard.invoke("calendar_create_event", {"title": "Yoga", "start_datetime": "2030-09-01T08:00"},
                               Scope("contact:1"), actor="test")
    assert outcome.status == "done", outcome
    assert outcome.result["title"] == "Yoga"
    assert server().uids() == [outcome.result["event_id"]]


def test_guard_runs_a_repeated_create_once(calendar_name, server):
    args = {"title": "Dinner with Marta", "start_datetime": "2030-10-10T21:00"}
    first = guard.invoke("calendar_create_event", args, Scope("contact:1"), actor="test")
    second = guard.invoke("calendar_create_event", {**args, "end_datetime": "2030-10-10T23:00"}, Scope("contact:1"),
                          actor="test")

    assert first.status == "done", first
    assert second.status == "duplicate", second
    assert second.duplicate is True
    assert second.result == first.result
    uids = server().uids()
    assert uids == [first.result["event_id"]]
    assert uids[0] == f"agentloop-claim-{first.claim_id}@agentloop"
