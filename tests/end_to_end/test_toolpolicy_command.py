"""`manage.py toolpolicy`: tool policies from a script — create with the tool's defaults,
update only what is given, refuse unknown tools and bad values, list them all."""

import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import run_python
from tools import guard
from tools.guard import Status
from tools.models import CalendarEvent, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db

EVENT = {"title": "Sesión de grupo", "start_datetime": "2026-12-03T18:00"}


def run(*args):
    out = StringIO()
    call_command("toolpolicy", *args, stdout=out)
    return out.getvalue()


def fields(out) -> dict:
    """The printed policy, one `label: value` line per field."""
    return dict(line.strip().split(":  ", 1) for line in out.splitlines()[1:])


def test_creates_with_the_tools_defaults_then_updates_only_what_is_given():
    out = run("email_send")
    assert out.splitlines()[0] == "created tool policy email_send"
    assert {k: v.strip() for k, v in fields(out).items()} == {
        "enabled": "on", "guarded": "on", "window": "600 s", "approval": "operator", "max per hour": "10",
        "timeout": "60 s", "proposal ttl": "86400 s", "fingerprint": "to + subject + body (default)"}

    out = run("email_send", "--approval", "none", "--window", "120", "--max-per-hour", "3", "--timeout", "30")
    assert out.splitlines()[0] == "updated tool policy email_send"
    policy = ToolPolicy.objects.get(name="email_send")
    assert (policy.approval, policy.window_seconds, policy.max_per_hour, policy.timeout_seconds) == \
        ("none", 120, 3, 30)
    assert policy.enabled and policy.guarded

    run("email_send", "--disable", "--no-guard", "--max-per-hour", "none")
    policy.refresh_from_db()
    assert (policy.enabled, policy.guarded, policy.max_per_hour, policy.window_seconds) == (False, False, None, 120)
    out = run("email_send", "--enable", "--guard", "--approval", "operator")
    policy.refresh_from_db()
    assert (policy.enabled, policy.guarded, policy.approval) == (True, True, "operator")
    assert fields(out)["max per hour"].strip() == "no limit"
    assert run("email_send").splitlines()[0] == "unchanged: tool policy email_send"
    assert ToolPolicy.objects.filter(name="email_send").count() == 1


def test_the_guard_follows_the_change_at_once(make_channel, make_conversation):
    scope = Scope.of_conversation(make_conversation(make_channel("shop"), "ana"))
    run("calendar_create_event", "--approval", "operator")
    outcome = guard.invoke("calendar_create_event", EVENT, scope, actor="test")
    assert outcome.status == Status.AWAITING_APPROVAL and not CalendarEvent.objects.exists()

    run("calendar_create_event", "--approval", "none", "--no-guard")
    assert guard.invoke("calendar_create_event", EVENT, scope, actor="test").status == Status.DONE
    assert CalendarEvent.objects.count() == 1

    run("calendar_create_event", "--disable")
    assert "calendar_create_event" not in [tool["function"]["name"] for tool in guard.offered_tools()]


def test_approval_user_asks_the_conversations_user(make_channel, make_conversation):
    scope = Scope.of_conversation(make_conversation(make_channel("shop", kind="telegram"), "ana"))
    out = run("calendar_create_event", "--approval", "user")
    assert fields(out)["approval"].strip() == "user"
    outcome = guard.invoke("calendar_create_event", EVENT, scope, actor="test")
    assert outcome.status == Status.AWAITING_APPROVAL and "user's confirmation" in outcome.note
    assert not CalendarEvent.objects.exists()


def test_approval_user_warns_which_channels_refuse_it(make_channel):
    make_channel("partner-api", kind="api")
    err = StringIO()
    call_command("toolpolicy", "calendar_create_event", "--approval", "user", stdout=StringIO(), stderr=err)
    assert "refused" in err.getvalue() and "partner-api" in err.getvalue()


def test_an_unknown_tool_is_refused_naming_the_registered_ones():
    with pytest.raises(CommandError, match="unknown tool 'launch_rockets'; registered tools: calendar_create_event, "
                                           "calendar_delete_event, calendar_list_events, email_send, handoff"):
        run("launch_rockets", "--approval", "none")
    assert not ToolPolicy.objects.exists()


def test_an_external_agents_existing_action_can_be_updated():
    ToolPolicy.objects.create(name="ext:7:refund")
    run("ext:7:refund", "--approval", "operator", "--window", "3600")
    policy = ToolPolicy.objects.get(name="ext:7:refund")
    assert (policy.approval, policy.window_seconds) == ("operator", 3600)


@pytest.mark.parametrize("args, message", [
    (["--window", "0"], "--window: Ensure this value is greater than or equal to 1"),
    (["--timeout", "-5"], "--timeout: Ensure this value is greater than or equal to"),
    (["--max-per-hour", "0"], "--max-per-hour: Ensure this value is greater than or equal to 1"),
    (["--max-per-hour", "lots"], "'lots' is not a whole number or 'none'"),
    (["--window", "ten"], "invalid int value"),
    (["--approval", "anyone"], r"invalid choice: 'anyone' \(choose from 'none', 'operator', 'user'\)"),
    (["--enable", "--disable"], "not allowed with argument --enable"),
])
def test_bad_values_are_refused_and_nothing_changes(args, message):
    run("calendar_delete_event", "--window", "300")
    with pytest.raises(CommandError, match=message):
        run("calendar_delete_event", "--timeout", "20", *args)
    policy = ToolPolicy.objects.get(name="calendar_delete_event")
    assert (policy.window_seconds, policy.timeout_seconds, policy.enabled) == (300, 60, True)


def test_without_a_name_lists_every_policy():
    ToolPolicy.objects.create(name="ext:7:refund", approval="operator", max_per_hour=2)
    lines = run().splitlines()
    assert [line.split()[0] for line in lines] == ["calendar_create_event", "calendar_delete_event",
                                                   "calendar_list_events", "email_send", "ext:7:refund", "handoff",
                                                   "handoff_to_agent", "reminder_create"]
    [ext] = [line for line in lines if line.startswith("ext:7:refund")]
    assert "approval operator" in ext and "max/hour 2 " in ext
    assert "approval none" in lines[0] and "max/hour no limit" in lines[0] and " enabled " in lines[0]


def test_from_the_command_line(processes):
    """A real `manage.py toolpolicy` on the test database: exit codes and what it prints."""
    def manage(*args):
        return run_python([sys.executable, "manage.py", "toolpolicy", *args], env=processes.env(), timeout=60)

    done = manage("calendar_create_event", "--approval", "operator", "--window", "900", "--max-per-hour", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "created tool policy calendar_create_event"
    assert "  approval:      operator" in done.stdout.splitlines()
    policy = ToolPolicy.objects.get(name="calendar_create_event")
    assert (policy.approval, policy.window_seconds, policy.max_per_hour) == ("operator", 900, 4)

    refused = manage("nope", "--window", "5")
    assert refused.returncode == 1 and "CommandError: unknown tool 'nope'; registered tools:" in refused.stderr
