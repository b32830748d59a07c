"""The console's websockets, through the real ASGI application (session auth, origin
check, routing) with channels' test communicator: who may connect, what the dashboard
and the playground send, and bad input."""

import asyncio
import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from conversations.ingest import Inbound, admit
from conversations.models import Channel
from tests.support.console_socket import ConsoleSocket

pytestmark = pytest.mark.django_db(transaction=True)

# A host of the default ALLOWED_HOSTS: channels' origin validator reads that list when the
# ASGI application is built, before the test runner adds `testserver` to it.
ORIGIN = (b"origin", b"http://localhost")


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


WATCH = ["view_auditevent"]
OPERATE = ["view_auditevent", "change_channel", "change_proposal"]


def make_user(name, staff=True, perms=()):
    user = get_user_model().objects.create_user(name, password="pw-" + name, is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def headers_for(user=None, origin=ORIGIN):
    """Built outside the event loop: logging in writes a session row."""
    return [h for h in (origin, session_cookie(user) if user else None) if h]


def communicator(path, headers):
    return ConsoleSocket(path, headers)


def talk(path, user, body):
    """Connect to `path` as `user`, then `await body(comm, first_message)`, then disconnect."""
    headers = headers_for(user)

    async def run():
        comm = communicator(path, headers)
        connected, _ = await comm.connect()
        assert connected
        await body(comm, await comm.receive_json_from(timeout=5))
        await comm.disconnect()
    asyncio.run(run())


async def receive_until(comm, predicate, timeout=5.0):
    """Messages until one matches (the live feed interleaves events and snapshots)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, "no matching message arrived"
        message = await comm.receive_json_from(timeout=left)
        if predicate(message):
            return message


@pytest.fixture
def playground(db):
    return Channel.objects.create(slug="playground", kind="webchat", agent="demo", window_closed=2.0)


# --- who may connect ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ws/console/dashboard/", "/ws/console/playground/playground/"])
def test_anonymous_is_refused(playground, path):
    headers = headers_for()

    async def run():
        comm = communicator(path, headers)
        connected, _ = await comm.connect()
        assert not connected
    asyncio.run(run())


@pytest.mark.parametrize("path", ["/ws/console/dashboard/", "/ws/console/playground/playground/"])
def test_a_user_who_is_not_staff_is_refused(playground, path):
    user = make_user("visitor", staff=False)
    headers = headers_for(user)

    async def run():
        comm = communicator(path, headers)
        connected, code = await comm.connect()
        assert not connected and code == 4403
    asyncio.run(run())


def test_each_page_needs_its_permission(playground):
    """An auditor (may view audit events) watches the dashboard but cannot chat; a staff
    user without that permission sees neither."""
    auditor, bare = make_user("auditor", perms=WATCH), make_user("bare")
    cases = [(auditor, "/ws/console/dashboard/", True), (auditor, "/ws/console/playground/playground/", False),
             (bare, "/ws/console/dashboard/", False), (bare, "/ws/console/playground/playground/", False)]
    cases = [(headers_for(user), path, expected) for user, path, expected in cases]

    async def run():
        for headers, path, expected in cases:
            comm = communicator(path, headers)
            connected, code = await comm.connect()
            assert connected is expected, path
            if connected:
                await comm.disconnect()
            else:
                assert code == 4403
    asyncio.run(run())


def test_another_sites_page_cannot_open_the_socket(playground):
    headers = headers_for(make_user("op", perms=OPERATE), origin=(b"origin", b"http://evil.example"))

    async def run():
        comm = communicator("/ws/console/dashboard/", headers)
        connected, _ = await comm.connect()
        assert not connected
    asyncio.run(run())


def test_playground_of_an_unknown_or_non_webchat_channel_is_refused(playground):
    Channel.objects.create(slug="api-chan", kind="api")
    user = make_user("op", perms=OPERATE)
    headers = headers_for(user)

    async def run():
        for slug in ("nope", "api-chan"):
            comm = communicator(f"/ws/console/playground/{slug}/", headers)
            connected, code = await comm.connect()
            assert not connected and code == 4404
    asyncio.run(run())


# --- the dashboard -----------------------------------------------------------------------


def test_dashboard_sends_the_picture_then_live_events(playground):
    async def body(comm, first):
        assert first["type"] == "snapshot" and first["buffers"] == [] and first["can_decide"] is False
        assert {s["state"] for s in first["ledger"]} >= {"pending", "delivered", "abandoned"}
        assert len(first["charts"]["duplicates_per_day"]) == 14
        # A message admitted elsewhere (here: another thread, as the web process would).
        await sync_to_async(admit, thread_sensitive=False)(playground, Inbound("m1", "ana", "ana", text="hola"))
        event = await receive_until(comm, lambda m: m["type"] == "event")
        assert event["event"]["kind"] == "message" and event["event"]["text"] == "hola"
        assert event["event"]["disposition"] == "buffered" and event["event"]["window_seconds"] > 0
        picture = await receive_until(comm, lambda m: m["type"] == "snapshot")
        [buffer] = picture["buffers"]
        assert buffer["messages"] == 1 and buffer["channel"] == "playground"
    talk("/ws/console/dashboard/", make_user("watcher", perms=WATCH), body)


def test_dashboard_refuses_decisions_without_the_permission_and_bad_requests(playground):
    async def body(comm, first):
        await comm.send_json_to({"action": "apply", "proposal": 1})
        assert (await comm.receive_json_from(timeout=5)) == {
            "type": "error", "code": "cannot_decide", "error": "your role cannot decide proposals"}
        await comm.send_json_to({"action": "explode", "proposal": "x"})
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    talk("/ws/console/dashboard/", make_user("watcher", perms=WATCH), body)


def test_dashboard_rejects_a_proposal_for_an_operator(playground):
    from tools.models import ActionClaim, ClaimState, Proposal

    now = timezone.now()
    claim = ActionClaim.objects.create(scope="contact:1", action="email_send", fingerprint="f" * 64,
                                       state=ClaimState.PROPOSED, expires_at=now + timedelta(hours=1),
                                       lease_until=now + timedelta(hours=1), arguments={"to": ["a@b.c"]})
    proposal = Proposal.objects.create(claim=claim, expires_at=now + timedelta(hours=1))

    async def body(comm, first):
        assert first["can_decide"] and [p["proposal"] for p in first["proposals"]] == [proposal.pk]
        await comm.send_json_to({"action": "reject", "proposal": proposal.pk})
        decided = await receive_until(comm, lambda m: m["type"] == "decided")
        assert decided["state"] == "rejected"
        await comm.send_json_to({"action": "apply", "proposal": 999999})
        assert (await receive_until(comm, lambda m: m["type"] == "decided"))["state"] == "unknown"
    talk("/ws/console/dashboard/", make_user("op", perms=OPERATE), body)
    assert Proposal.objects.get(pk=proposal.pk).decided_by == "operator:op"


# --- the playground ----------------------------------------------------------------------


def test_playground_admits_what_is_typed_and_shows_the_countdown(playground):
    async def body(comm, hello):
        assert hello["type"] == "hello" and hello["agent"] == "demo" and hello["transcript"] == []
        await comm.send_json_to({"text": "quiero una cita.", "id": "a1"})
        admitted = await receive_until(comm, lambda m: m["type"] == "admitted")
        assert admitted["disposition"] == "buffered" and admitted["window_kind"] == "closed"
        assert admitted["window_seconds"] == 2.0
        assert admitted["flush_at"] > admitted["now"]
        event = await receive_until(comm, lambda m: m["type"] == "event")
        assert event["event"]["kind"] == "message" and event["event"]["conversation"] == hello["conversation"]
        # The same id again is the same message: not admitted twice.
        await comm.send_json_to({"text": "quiero una cita.", "id": "a1"})
        assert (await receive_until(comm, lambda m: m["type"] == "admitted"))["duplicate"] is True
    talk("/ws/console/playground/playground/", make_user("op", perms=OPERATE), body)


NUL = "text contains a NUL character (U+0000), which cannot be stored"


# Each error carries a code the page shows in the reader's language (static/console/console.js).
@pytest.mark.parametrize("payload, error", [
    ({"text": ""}, {"code": "empty", "error": "a message needs some text"}),
    ({"text": "   "}, {"code": "empty", "error": "a message needs some text"}),
    ({"text": 42}, {"code": "empty", "error": "a message needs some text"}),
    ({"nothing": True}, {"code": "empty", "error": "a message needs some text"}),
    ({"text": "x" * 4001}, {"code": "too_long", "limit": 4000, "error": "messages are limited to 4000 characters"}),
    ({"text": "hola\x00"}, {"code": "refused", "detail": NUL, "error": f"message refused: {NUL}"}),
])
def test_playground_answers_bad_input_with_an_error_and_admits_nothing(playground, payload, error):
    from conversations.models import InboundMessage

    async def body(comm, hello):
        await comm.send_json_to(payload)
        assert (await comm.receive_json_from(timeout=5)) == {"type": "error", **error}
    talk("/ws/console/playground/playground/", make_user("op", perms=OPERATE), body)
    assert not InboundMessage.objects.exists()


def test_playground_survives_a_frame_that_is_not_json(playground):
    async def body(comm, hello):
        await comm.send_to(text_data="{not json")
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
        await comm.send_json_to({"text": "still here?"})
        assert (await receive_until(comm, lambda m: m["type"] == "admitted"))["disposition"] == "buffered"
    talk("/ws/console/playground/playground/", make_user("op", perms=OPERATE), body)


def test_nothing_is_published_while_nobody_watches(playground):
    from agentloop.core.models import LiveEvent

    admit(playground, Inbound("m1", "ana", "ana", text="hola"))
    assert not LiveEvent.objects.exists()


def test_payloads_are_json_round_trippable(playground):
    """What the live path carries crosses Redis and the database as JSON."""
    from agentloop.console import dashboard as console

    json.dumps(console.snapshot())


def test_a_rolled_back_change_publishes_nothing(playground):
    from django.db import transaction

    from agentloop.core import live
    from agentloop.core.models import LiveEvent, LiveListener

    LiveListener.objects.create(name="web:1", seen_at=timezone.now())
    with pytest.raises(RuntimeError), transaction.atomic():
        live.publish([live.DASHBOARD], {"kind": "note"})
        raise RuntimeError("the change failed")
    assert not LiveEvent.objects.exists()
    live.publish([live.DASHBOARD], {"kind": "note"})
    assert LiveEvent.objects.count() == 1


def test_the_relay_waits_for_a_gap_in_the_ids_then_moves_past_it():
    """A lower id can become visible after a higher one (PostgreSQL hands ids out before
    commit): the relay's floor stays below the gap for a while, then gives up on it."""
    import time

    from agentloop.console.relay import Relay

    relay = Relay()
    relay.floor, relay.seen = 1, {3, 4}
    relay._advance_floor()
    assert relay.floor == 1 and relay.gap_since is not None  # 2 may still commit
    relay.seen.add(2)
    relay._advance_floor()
    assert relay.floor == 4 and relay.seen == set()
    relay.seen = {7}
    relay._advance_floor()
    relay.gap_since = time.monotonic() - Relay.SETTLE - 0.1
    relay._advance_floor()
    assert relay.floor == 7 and relay.seen == set() and relay.gap_since is None


# --- permissions are checked on every action, not only at connect ---------------------------


def open_proposal():
    from tools.models import ActionClaim, ClaimState, Proposal

    now = timezone.now()
    claim = ActionClaim.objects.create(scope="contact:1", action="email_send", fingerprint="e" * 64,
                                       state=ClaimState.PROPOSED, expires_at=now + timedelta(hours=1),
                                       lease_until=now + timedelta(hours=1), arguments={"to": ["a@b.c"]})
    return Proposal.objects.create(claim=claim, expires_at=now + timedelta(hours=1))


def revoke(user, codename):
    user.user_permissions.remove(Permission.objects.get(codename=codename))


async def closed_with(comm):
    """The close code, past any live events still on their way."""
    while True:
        output = await comm.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            return output["code"]


def operator_in_group():
    from django.contrib.auth.models import Group

    from agentloop.console.roles import OPERATORS, ensure_roles

    ensure_roles()
    user = make_user("groupie")
    user.groups.add(Group.objects.get(name=OPERATORS))
    return user


def test_an_operator_removed_from_their_group_mid_session_cannot_decide(playground):
    from tools.models import Proposal, ProposalState

    proposal, user = open_proposal(), operator_in_group()

    async def body(comm, first):
        assert first["can_decide"]
        await sync_to_async(user.groups.clear)()  # an admin withdraws the role; the socket stays open
        await comm.send_json_to({"action": "reject", "proposal": proposal.pk})
        refused = await receive_until(comm, lambda m: m["type"] in ("error", "decided"))
        assert refused == {"type": "error", "code": "withdrawn", "error": "your access to this page was withdrawn"}
        assert await closed_with(comm) == 4403
    talk("/ws/console/dashboard/", user, body)
    assert Proposal.objects.get(pk=proposal.pk).state == ProposalState.PENDING


def test_an_auditor_may_watch_on_but_an_operator_losing_the_decide_permission_cannot_apply(playground):
    from tools.models import Proposal, ProposalState

    proposal, user = open_proposal(), make_user("op", perms=OPERATE)

    async def body(comm, first):
        assert first["can_decide"]
        await sync_to_async(revoke)(user, "change_proposal")
        await comm.send_json_to({"action": "apply", "proposal": proposal.pk})
        assert (await receive_until(comm, lambda m: m["type"] in ("error", "decided"))) == {
            "type": "error", "code": "cannot_decide", "error": "your role cannot decide proposals"}
        await comm.send_json_to({"action": "apply", "proposal": proposal.pk})  # still watching, still refused
        assert (await receive_until(comm, lambda m: m["type"] in ("error", "decided")))["type"] == "error"
    talk("/ws/console/dashboard/", user, body)
    assert Proposal.objects.get(pk=proposal.pk).state == ProposalState.PENDING


def test_a_playground_user_who_lost_the_permission_is_refused_on_the_next_message(playground):
    from conversations.models import InboundMessage

    user = make_user("op", perms=OPERATE)

    async def body(comm, hello):
        await comm.send_json_to({"text": "hola.", "id": "a1"})
        assert (await receive_until(comm, lambda m: m["type"] == "admitted"))["duplicate"] is False
        await sync_to_async(revoke)(user, "change_channel")
        await comm.send_json_to({"text": "¿sigues ahí?", "id": "a2"})
        refused = await receive_until(comm, lambda m: m["type"] in ("error", "admitted"))
        assert refused == {"type": "error", "code": "withdrawn", "error": "your access to this page was withdrawn"}
        assert await closed_with(comm) == 4403
    talk("/ws/console/playground/playground/", user, body)
    assert list(InboundMessage.objects.values_list("text", flat=True)) == ["hola."]


# --- what the first messages carry: redacted like every live event ----------------------------------

LEAKED_TOKEN = "5550001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def test_the_dashboards_first_snapshot_is_redacted(playground):
    from tools.models import ActionClaim, ClaimState, Proposal

    now = timezone.now()
    claim = ActionClaim.objects.create(scope="contact:1", action="email_send", fingerprint="f" * 64,
                                       state=ClaimState.PROPOSED, expires_at=now + timedelta(hours=1),
                                       lease_until=now + timedelta(hours=1),
                                       arguments={"to": ["a@b.c"], "body": f"our bot is {LEAKED_TOKEN}"})
    Proposal.objects.create(claim=claim, expires_at=now + timedelta(hours=1))
    admit(playground, Inbound("m1", "ana", "ana", text=f"pegué esto: {LEAKED_TOKEN}"))

    async def body(comm, first):
        assert first["type"] == "snapshot" and first["proposals"] and first["buffers"]
        assert LEAKED_TOKEN.split(":")[1] not in json.dumps(first, ensure_ascii=False)
    talk("/ws/console/dashboard/", make_user("watcher", perms=WATCH), body)


def test_the_playgrounds_hello_transcript_is_redacted(playground):
    user = make_user("op", perms=OPERATE)

    async def paste(comm, hello):
        await comm.send_json_to({"text": f"my token is {LEAKED_TOKEN}", "id": "t1"})
        await receive_until(comm, lambda m: m["type"] == "admitted")

    async def reopen(comm, hello):
        assert hello["type"] == "hello" and len(hello["transcript"]) == 1
        assert LEAKED_TOKEN.split(":")[1] not in json.dumps(hello, ensure_ascii=False)
    talk("/ws/console/playground/playground/", user, paste)
    talk("/ws/console/playground/playground/", user, reopen)
