"""The action guard on the real database: fingerprints, windows, claim-before /
confirm-after, failures, uncertainty and reconciliation, the guard-only API functions."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from tests.support.tools_for_tests import FlakyCreate, GatedCreate
from tools import guard, registry
from tools.guard import Status
from tools.models import ActionClaim, CalendarEvent, ClaimState, ToolPolicy
from tools.registry import Scope

BUILTIN = [
    "tools.builtin.calendar.CreateEvent",
    "tools.builtin.calendar.ListEvents",
    "tools.builtin.calendar.DeleteEvent",
    "tools.builtin.email.SendEmail",
]
TEST_TOOLS = BUILTIN + ["tests.support.tools_for_tests.GatedCreate", "tests.support.tools_for_tests.FlakyCreate",
                        "tests.support.tools_for_tests.AmbiguousCreate"]

pytestmark = pytest.mark.django_db

PSICO_1 = {"title": "Psicología", "start_datetime": "2026-12-01T10:00:00"}
PSICO_2 = {"title": "Psicología", "start_datetime": "2026-12-08T10:00:00"}


@pytest.fixture
def conversation(make_channel, make_conversation):
    return make_conversation(make_channel("shop"), "ana")


@pytest.fixture
def scope(conversation):
    return Scope.of_conversation(conversation)


@pytest.fixture
def email_without_approval(db):
    """email_send as an operator who trusts their users has set it: no approval (the
    default, approval, is tested in test_email_smtp)."""
    ToolPolicy.objects.create(name="email_send", approval="none")


@pytest.fixture
def test_tools(settings):
    settings.AGENTLOOP_TOOLS = TEST_TOOLS
    GatedCreate.reset()
    FlakyCreate.runs, FlakyCreate.failures_left = [], 0


def invoke(name, arguments, scope, **kw):
    kw.setdefault("actor", "test")
    return guard.invoke(name, arguments, scope, **kw)


def duplicates():
    return AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED)


# --- the incident ------------------------------------------------------------------------


def test_the_incident_two_events_not_four(scope, conversation):
    """The second "agéndame", 12 s later, repeats both creates with an extra end_datetime."""
    first = [invoke("calendar_create_event", args, scope) for args in (PSICO_1, PSICO_2)]
    assert [o.status for o in first] == [Status.DONE, Status.DONE]
    second = [invoke("calendar_create_event", {**args, "end_datetime": args["start_datetime"][:11] + "11:00:00"},
                     scope) for args in (PSICO_1, PSICO_2)]

    assert CalendarEvent.objects.count() == 2
    assert [o.status for o in second] == [Status.DUPLICATE, Status.DUPLICATE]
    for original, repeat in zip(first, second, strict=True):
        body = repeat.for_model()
        assert body["duplicate"] is True and body["status"] == "duplicate"
        assert "already carried out" in body["note"] and "tell the user" in body["note"]
        assert body["original"]["claim"] == original.claim_id
        assert body["result"] == original.result == body["original"]["result"]
        assert body["result"]["event_id"].startswith(f"agentloop-claim-{original.claim_id}")
    events = list(duplicates().order_by("at"))
    assert len(events) == 2
    assert {e.extra["original_claim"] for e in events} == {o.claim_id for o in first}
    assert all(e.conversation_id == conversation.pk and e.channel_slug == "shop" for e in events)
    assert all(e.extra["tool"] == "calendar_create_event" and e.extra["age_seconds"] >= 0 for e in events)
    assert ActionClaim.objects.get(pk=first[0].claim_id).duplicates_caught == 1


@pytest.mark.parametrize("restated", [
    {"title": "  PSICOLOGÍA ", "start_datetime": "2026-12-01T10:00"},  # case, spacing, no seconds
    {"title": "psicología", "start_datetime": "2026-12-01T09:00:00Z"},  # same instant in UTC
    {"title": "Psicología", "start_datetime": "2026-12-01T04:00:00-05:00", "location": "Consulta 3"},
])
def test_the_same_event_restated_is_a_duplicate(settings, scope, restated):
    settings.AGENTLOOP_DEFAULT_TIME_ZONE = "Europe/Madrid"  # 10:00 there is 09:00Z in December
    assert invoke("calendar_create_event", PSICO_1, scope).status == Status.DONE
    assert invoke("calendar_create_event", restated, scope).status == Status.DUPLICATE
    assert CalendarEvent.objects.count() == 1


def test_another_time_or_another_contact_is_another_action(make_channel, make_conversation, scope):
    other = Scope.of_conversation(make_conversation(make_channel("other"), "bea"))
    assert invoke("calendar_create_event", PSICO_1, scope).status == Status.DONE
    assert invoke("calendar_create_event", {**PSICO_1, "start_datetime": "2026-12-01T11:00"}, scope).status == "done"
    assert invoke("calendar_create_event", PSICO_1, other).status == Status.DONE
    assert CalendarEvent.objects.count() == 3
    assert not duplicates().exists()


def test_reads_repeat_freely_and_are_never_claimed(scope):
    invoke("calendar_create_event", {"title": "X", "start_datetime": "2099-01-01T10:00"}, scope)
    claims = ActionClaim.objects.count()
    outcomes = [invoke("calendar_list_events", {}, scope) for _ in range(3)]
    assert [o.status for o in outcomes] == [Status.DONE] * 3
    assert all(o.result["count"] == 1 and o.result["events"][0]["title"] == "X" for o in outcomes)
    assert ActionClaim.objects.count() == claims and not duplicates().exists()


def test_email_a_corrected_body_is_a_new_email(scope, mailoutbox, email_without_approval):
    mail = {"to": "ana@example.com", "subject": "Confirmación", "body": "Su cita es el lunes."}
    assert invoke("email_send", mail, scope).status == Status.DONE
    assert invoke("email_send", {**mail, "to": "ANA@example.com", "subject": " confirmación"}, scope).status == \
        Status.DUPLICATE
    assert invoke("email_send", {**mail, "body": "Su cita es el martes."}, scope).status == Status.DONE
    assert [m.body for m in mailoutbox] == ["Su cita es el lunes.", "Su cita es el martes."]
    claim = ActionClaim.objects.filter(action="email_send").first()
    assert claim.fingerprint_material["body"].startswith("sha256:")  # the body itself is not in the identity


def test_after_the_window_the_same_action_is_allowed(scope):
    first = invoke("calendar_create_event", PSICO_1, scope)
    ActionClaim.objects.filter(pk=first.claim_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    again = invoke("calendar_create_event", PSICO_1, scope)
    assert again.status == Status.DONE and again.claim_id != first.claim_id
    assert CalendarEvent.objects.count() == 2
    assert not ActionClaim.objects.get(pk=first.claim_id).live


def test_the_window_and_fingerprint_come_from_the_policy(scope):
    ToolPolicy.objects.create(name="calendar_create_event", window_seconds=30, fingerprint_fields=["title"])
    first = invoke("calendar_create_event", PSICO_1, scope)
    claim = ActionClaim.objects.get(pk=first.claim_id)
    assert (claim.expires_at - claim.created_at) == timedelta(seconds=30)
    assert invoke("calendar_create_event", PSICO_2, scope).status == Status.DUPLICATE  # same title only


def test_a_policy_can_switch_the_guard_or_the_tool_off(scope):
    ToolPolicy.objects.create(name="calendar_create_event", guarded=False)
    ToolPolicy.objects.create(name="email_send", enabled=False)
    assert [invoke("calendar_create_event", PSICO_1, scope).status for _ in range(2)] == ["done", "done"]
    assert CalendarEvent.objects.count() == 2 and not ActionClaim.objects.exists()
    with pytest.raises(guard.ToolDisabled):
        invoke("email_send", {"to": "a@b.co", "subject": "s", "body": "b"}, scope)


@pytest.mark.parametrize("arguments, message", [
    ({"title": "X"}, "start_datetime"),
    ({"title": "X", "start_datetime": "next monday"}, "not an ISO 8601"),
    ({"title": "X", "start_datetime": "2026-12-01T10:00", "end_datetime": "2026-12-01T09:00"}, "after"),
    ({"title": "X", "start_datetime": "2026-12-01T10:00", "colour": "red"}, "Additional properties"),
    ("not an object", "JSON object"),
])
def test_bad_arguments_are_refused_before_any_claim(scope, arguments, message):
    with pytest.raises(registry.InvalidArguments, match=message):
        invoke("calendar_create_event", arguments, scope)
    assert not ActionClaim.objects.exists() and not CalendarEvent.objects.exists()


def test_unknown_tool():
    with pytest.raises(registry.UnknownTool):
        guard.invoke("launch_rockets", {}, Scope("contact:1"), actor="test")


# --- failures and retries ----------------------------------------------------------------


def test_a_tool_that_fails_releases_its_claim_so_the_retry_runs(test_tools, scope):
    FlakyCreate.failures_left = 1
    failed = invoke("flaky_create", {"name": "x"}, scope)
    assert failed.status == Status.FAILED and "the backend said no" in failed.for_model()["error"]
    assert ActionClaim.objects.get(pk=failed.claim_id).state == ClaimState.RELEASED
    retried = invoke("flaky_create", {"name": "x"}, scope)
    assert retried.status == Status.DONE and FlakyCreate.runs == [{"name": "x"}]
    assert invoke("flaky_create", {"name": "x"}, scope).status == Status.DUPLICATE
    assert FlakyCreate.runs == [{"name": "x"}]


def test_an_unreachable_mail_server_is_a_failure_and_the_retry_sends(settings, scope, mailoutbox,
                                                                    email_without_approval):
    from tests.conftest import free_port

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 2
    mail = {"to": "ana@example.com", "subject": "Hola", "body": "..."}
    failed = invoke("email_send", mail, scope)
    assert failed.status == Status.FAILED and "could not reach the mail server" in failed.error
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert invoke("email_send", mail, scope).status == Status.DONE
    assert len(mailoutbox) == 1


# --- in flight, uncertain, reconciled --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_identical_call_in_flight_waits_for_its_outcome(test_tools, make_channel, make_conversation):
    scope = Scope.of_conversation(make_conversation(make_channel("shop"), "ana"))
    outcomes = {}

    def first():
        outcomes["first"] = invoke("gated_create", {"name": "x"}, scope)
        connection.close()

    holder = threading.Thread(target=first)
    holder.start()
    assert GatedCreate.entered.wait(10)
    threading.Timer(0.3, GatedCreate.gate.set).start()
    second = invoke("gated_create", {"name": "x", "note": "again"}, scope, wait=5)
    holder.join(10)
    assert outcomes["first"].status == Status.DONE
    assert second.status == Status.DUPLICATE and second.result == {"made": "x"}
    assert GatedCreate.runs == [{"name": "x"}]


@pytest.mark.django_db(transaction=True)
def test_an_identical_call_answers_in_progress_when_the_first_outlasts_the_wait(test_tools, make_channel,
                                                                               make_conversation):
    scope = Scope.of_conversation(make_conversation(make_channel("shop"), "ana"))
    holder = threading.Thread(target=lambda: (invoke("gated_create", {"name": "x"}, scope), connection.close()))
    holder.start()
    assert GatedCreate.entered.wait(10)
    second = invoke("gated_create", {"name": "x"}, scope, wait=0.1)
    GatedCreate.gate.set()
    holder.join(10)
    assert second.status == Status.IN_PROGRESS and second.duplicate
    assert "in progress" in second.note
    assert GatedCreate.runs == [{"name": "x"}]
    assert duplicates().get().extra["status"] == "in_progress"


def interrupted_claim(tool_name, arguments, scope):
    """A claim as a process that died between claim and confirm leaves it."""
    tool = registry.get(tool_name)
    fp = tool.fingerprint(arguments, scope)
    attempt = guard.take_claim(guard.ClaimRequest(tool_name, arguments, scope, fp, guard.policy_for(tool_name)),
                               owner="worker:dead")
    ActionClaim.objects.filter(pk=attempt.claim.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    return attempt.claim


def test_interrupted_create_that_happened_is_reconciled_not_rerun(scope):
    claim = interrupted_claim("calendar_create_event", PSICO_1, scope)
    registry.get("calendar_create_event").run(guard.helpers._call_of(claim))  # the effect landed before the crash
    again = invoke("calendar_create_event", PSICO_1, scope)
    assert again.status == Status.DUPLICATE and again.original["claim"] == claim.pk
    assert again.result["event_id"] == f"agentloop-claim-{claim.pk}@agentloop"
    assert CalendarEvent.objects.count() == 1
    claim.refresh_from_db()
    assert claim.state == ClaimState.DONE
    kinds = list(AuditEvent.objects.order_by("pk").values_list("kind", flat=True))
    assert kinds == [EventKind.ACTION_UNCERTAIN, EventKind.ACTION_RECONCILED, EventKind.DUPLICATE_PREVENTED]


def test_interrupted_create_that_did_not_happen_is_reconciled_and_runs_now(scope):
    claim = interrupted_claim("calendar_create_event", PSICO_1, scope)
    again = invoke("calendar_create_event", PSICO_1, scope)
    assert again.status == Status.DONE and again.claim_id != claim.pk
    assert CalendarEvent.objects.count() == 1
    claim.refresh_from_db()
    assert claim.state == ClaimState.RELEASED and "did not happen" in claim.error


def test_interrupted_email_is_reported_to_the_model_never_resent(scope, mailoutbox, email_without_approval):
    mail = {"to": "ana@example.com", "subject": "Factura", "body": "Adjunta."}
    claim = interrupted_claim("email_send", mail, scope)
    outcomes = [invoke("email_send", mail, scope) for _ in range(2)]
    assert [o.status for o in outcomes] == [Status.UNCERTAIN, Status.UNCERTAIN]
    assert all(o.duplicate and "may or may not have happened" in o.note for o in outcomes)
    assert mailoutbox == []
    claim.refresh_from_db()
    assert claim.state == ClaimState.UNCERTAIN
    assert guard.release(claim.pk, by="operator:olga")  # a person checked: it was not sent
    assert invoke("email_send", mail, scope).status == Status.DONE and len(mailoutbox) == 1


def test_a_calls_own_unknown_outcome_is_uncertain_not_a_duplicate(test_tools, scope):
    own = invoke("ambiguous_create", {"name": "x"}, scope)
    assert own.status == Status.UNCERTAIN and not own.duplicate and "may have happened" in own.note
    repeat = invoke("ambiguous_create", {"name": "x"}, scope)
    assert repeat.status == Status.UNCERTAIN and repeat.duplicate and repeat.original["claim"] == own.claim_id


def test_the_sweep_settles_claims_left_in_flight(scope):
    happened = interrupted_claim("calendar_create_event", PSICO_1, scope)
    registry.get("calendar_create_event").run(guard.helpers._call_of(happened))
    lost = interrupted_claim("email_send", {"to": "a@b.co", "subject": "s", "body": "b"}, scope)
    report = guard.sweep()
    assert report["uncertain"] == 2 and report["reconciled"] == 1
    assert ActionClaim.objects.get(pk=happened.pk).state == ClaimState.DONE
    assert ActionClaim.objects.get(pk=lost.pk).state == ClaimState.UNCERTAIN


def test_a_run_that_outlives_its_lease_still_confirms(scope):
    """The truth wins: a run that finishes after being marked uncertain confirms the claim."""
    claim = interrupted_claim("calendar_create_event", PSICO_1, scope)
    guard.mark_uncertain(claim)
    outcome = guard.execute(registry.get("calendar_create_event"), claim)
    assert outcome.status == Status.DONE
    assert ActionClaim.objects.get(pk=claim.pk).state == ClaimState.DONE


# --- the guard alone (tools the agent runs itself) ---------------------------------------------


def test_guard_only_claim_succeed_then_duplicate():
    scope = Scope.of_agent(7, "customer-42")
    args = {"order": "A-1", "amount": 30}
    first, created = guard.claim_action("refund", args, scope, actor="agent", agent_key_id=7)
    assert created and first.status == "proceed"
    busy, created = guard.claim_action("refund", args, scope, actor="agent", agent_key_id=7, wait=0)
    assert not created and busy.status == Status.IN_PROGRESS
    guard.succeed(first.claim_id, {"refund_id": "R9"}, agent_key_id=7)
    guard.succeed(first.claim_id, {"refund_id": "R9"}, agent_key_id=7)  # a retried confirmation is harmless
    dup, created = guard.claim_action("refund", {"amount": 30, "order": "A-1"}, scope, actor="agent",
                                      agent_key_id=7)
    assert not created and dup.status == Status.DUPLICATE and dup.result == {"refund_id": "R9"}


def test_guard_only_fail_releases_and_explicit_fingerprint_fields():
    scope = Scope.of_agent(7, "customer-42")
    first, _ = guard.claim_action("book_table", {"day": "fri", "people": 2, "note": "window"}, scope,
                                  fields=["day", "people"], actor="agent", agent_key_id=7)
    guard.fail(first.claim_id, "restaurant closed", agent_key_id=7)
    with pytest.raises(guard.ClaimConflict):
        guard.succeed(first.claim_id, {}, agent_key_id=7)
    again, created = guard.claim_action("book_table", {"day": "fri", "people": 2, "note": "aisle"}, scope,
                                        fields=["day", "people"], actor="agent", agent_key_id=7)
    assert created
    with pytest.raises(ActionClaim.DoesNotExist):
        guard.succeed(again.claim_id, {}, agent_key_id=8)  # another agent's claim does not exist for it
