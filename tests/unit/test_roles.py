"""Operators and auditors: `createuser` gives a person one role; auditors read the audit
trail, the guard's claims and proposals and the delivery ledger — and nothing else, never
a secret; operators run everything, channels included."""

import io
import re
from html import unescape

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from agentloop.console import roles
from audit.models import AuditEvent, CaughtDuplicate
from conversations.models import AgentKey, Channel, Turn
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome, UnreachableChat
from delivery.transports import SendResult
from tests.unit.test_admin import NO_RULES
from tools import guard
from tools.models import ActionClaim, ClaimState, Proposal, ProposalState, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db

BOT_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
WEBHOOK_SECRET = "whsec-known-webhook-secret-42"
CALLBACK_SECRET = "cbsec-known-callback-secret-42"
AGENT_SECRET = "agent-config-secret-42"
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}
AUDITED = ["audit_auditevent", "audit_caughtduplicate", "tools_actionclaim", "tools_proposal",
           "delivery_outboundmessage", "delivery_unreachablechat"]


def create_user(name, role, *extra):
    out = io.StringIO()
    call_command("createuser", name, "--role", role, *extra, stdout=out)
    return out.getvalue()


def logged_in(client, name, role):
    create_user(name, role, "--password", f"pw-{name}-1")
    # Through the admin's login form (django-axes watches it; client.login gives it no request).
    response = client.post("/admin/login/", {"username": name, "password": f"pw-{name}-1", "next": "/admin/"})
    assert response.status_code == 302, response.content
    return client


@pytest.fixture
def auditor(client):
    return logged_in(client, "audrey", "auditor")


@pytest.fixture
def operator(client):
    return logged_in(client, "olga", "operator")


@pytest.fixture
def history(make_channel, make_conversation, agent_key):
    """A bit of everything an auditor reads, next to channels holding known secrets."""
    bot = make_channel("tg", kind="telegram", platform_settings={
        "bot_token": BOT_TOKEN, "webhook_secret": WEBHOOK_SECRET},
        agent="webhook", agent_config={"url": "https://agent.example.com", "secret": AGENT_SECRET})
    api = make_channel("shop", platform_settings={
        "callback_url": "https://shop.example.com/replies", "callback_secret": CALLBACK_SECRET})
    agent_key(bot, api)
    conversation = make_conversation(bot, "101")
    scope = Scope.of_conversation(conversation)
    Turn.objects.create(conversation=conversation, merged_input="agéndame", flush_reason="window", state="running",
                        owner="w1", started_at=timezone.now())
    first = guard.invoke("calendar_create_event", EVENT, scope, actor="worker:w1")
    guard.invoke("calendar_create_event", EVENT, scope, actor="worker:w1")  # caught
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval="operator")
    guard.forget_policies()
    proposal = guard.invoke("calendar_create_event", {**EVENT, "title": "Kine"}, scope, actor="t").proposal_id
    # An error text that carries the bot's URL (a misconfigured api_base does that).
    row = ledger.enqueue(conversation, "hola", kind=OutboundKind.REPLY)
    [claimed] = ledger.claim_many([row.pk], "w1")
    ledger.finish(claimed, "w1", SendResult.failed(
        Outcome.PERMANENT, f"aiohttp.InvalidURL: htp://bad/bot{BOT_TOKEN}/sendMessage chat not found"))
    ledger.enqueue(make_conversation(api, "ana"), "¿sigue?", kind=OutboundKind.REPLY)
    return {"claim": first.claim_id, "proposal": proposal, "row": row.pk, "conversation": conversation.pk}


def objects():
    """One object of each page an auditor may open."""
    return {"audit_auditevent": AuditEvent.objects.first(), "audit_caughtduplicate": CaughtDuplicate.objects.filter(
        kind="duplicate_prevented").first(), "tools_actionclaim": ActionClaim.objects.first(),
        "tools_proposal": Proposal.objects.first(), "delivery_outboundmessage": OutboundMessage.objects.first(),
        "delivery_unreachablechat": UnreachableChat.objects.first()}


def assert_no_secret(html, where):
    for secret in (BOT_TOKEN, BOT_TOKEN.split(":")[1], WEBHOOK_SECRET, CALLBACK_SECRET, AGENT_SECRET,
                   *AgentKey.objects.values_list("key_hash", flat=True)):
        assert secret not in html, f"{secret!r} shown on {where}"


# --- createuser --------------------------------------------------------------------------------

def test_migrate_leaves_both_groups_with_their_permissions():
    operators, auditors = Group.objects.get(name="Operators"), Group.objects.get(name="Auditors")
    assert operators.permissions.count() == Permission.objects.count()
    codenames = set(auditors.permissions.values_list("content_type__app_label", "codename"))
    assert codenames == {("audit", "view_auditevent"), ("audit", "view_caughtduplicate"),
                         ("tools", "view_actionclaim"), ("tools", "view_proposal"),
                         ("delivery", "view_outboundmessage"), ("delivery", "view_unreachablechat"),
                         ("agentloop", "view_metrics")}  # GET /metrics: counts, no texts
    roles.ensure_roles()  # idempotent
    assert Group.objects.filter(name__in=["Operators", "Auditors"]).count() == 2
    assert auditors.permissions.count() == 7


@pytest.mark.parametrize("role, group", [("operator", "Operators"), ("auditor", "Auditors")])
def test_createuser_creates_each_role_with_a_password_shown_once(role, group):
    out = create_user("ana", role, "--email", "ana@example.com")
    password = out.split("password: ")[1].split()[0]
    user = User.objects.get(username="ana")
    assert user.check_password(password) and user.email == "ana@example.com"
    assert user.is_staff and not user.is_superuser and user.is_active
    assert list(user.groups.values_list("name", flat=True)) == [group]


def test_createuser_is_idempotent_and_changes_role_and_password():
    create_user("ana", "auditor", "--password", "first-pw-1")
    again = create_user("ana", "auditor")
    assert "password" not in again  # unchanged, not shown
    user = User.objects.get(username="ana")
    assert user.check_password("first-pw-1")
    user.is_superuser = True
    user.save()
    create_user("ana", "Operator", "--password", "second-pw-2")
    user.refresh_from_db()
    assert user.check_password("second-pw-2") and not user.is_superuser
    assert list(user.groups.values_list("name", flat=True)) == ["Operators"]
    assert user.has_perm("conversations.change_channel")
    create_user("ana", "auditor")
    user = User.objects.get(username="ana")  # a fresh permission cache
    assert list(user.groups.values_list("name", flat=True)) == ["Auditors"]
    assert not user.has_perm("conversations.view_channel") and user.has_perm("tools.view_actionclaim")
    assert User.objects.count() == 1


@pytest.mark.parametrize("args, message", [
    (["ana", "--role", "admin"], "unknown role 'admin'"),
    (["  ", "--role", "auditor"], "user name is empty"),
    (["ana ana", "--role", "auditor"], "bad user name"),
    (["ana", "--role", "auditor", "--password", ""], "password is empty"),
])
def test_createuser_rejects_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("createuser", *args, stdout=io.StringIO())
    assert not User.objects.exists()


# --- auditors ----------------------------------------------------------------------------------

def test_an_auditor_reads_every_audited_page_and_never_a_secret(auditor, history):
    index = auditor.get(reverse("admin:index"))
    assert index.status_code == 200
    assert_no_secret(index.content.decode(), "the admin index")
    for name, obj in objects().items():
        for url in (reverse(f"admin:{name}_changelist"), reverse(f"admin:{name}_change", args=[obj.pk]),
                    reverse(f"admin:{name}_history", args=[obj.pk])):
            page = auditor.get(url)
            assert page.status_code == 200, url
            html = page.content.decode()
            assert_no_secret(html, url)
            assert 'name="_save"' not in html, url
    # the token never reached the stored error text (redacted where written)
    assert BOT_TOKEN not in OutboundMessage.objects.get(pk=history["row"]).last_error
    row = auditor.get(reverse("admin:delivery_outboundmessage_change", args=[history["row"]])).content.decode()
    assert "/bot•••/sendMessage" in row


def test_an_auditor_changes_nothing(auditor, history):
    counts = {name: type(obj).objects.count() for name, obj in objects().items()}
    for name, obj in objects().items():
        assert auditor.get(reverse(f"admin:{name}_add")).status_code == 403, name
        assert auditor.post(reverse(f"admin:{name}_change", args=[obj.pk]), {}).status_code == 403, name
        assert auditor.get(reverse(f"admin:{name}_delete", args=[obj.pk])).status_code == 403, name
        assert auditor.post(reverse(f"admin:{name}_delete", args=[obj.pk]), {"post": "yes"}).status_code == 403
    # the operators' actions are not offered, and posting them does nothing
    claims = auditor.get(reverse("admin:tools_actionclaim_changelist")).content.decode()
    rows = auditor.get(reverse("admin:delivery_outboundmessage_changelist")).content.decode()
    assert "release_claims" not in claims and "retry_now" not in rows
    ActionClaim.objects.filter(pk=history["claim"]).update(state=ClaimState.UNCERTAIN)
    auditor.post(reverse("admin:tools_actionclaim_changelist"),
                 {"action": "release_claims", "_selected_action": [history["claim"]]})
    auditor.post(reverse("admin:delivery_outboundmessage_changelist"),
                 {"action": "retry_now", "_selected_action": [history["row"]]})
    assert ActionClaim.objects.get(pk=history["claim"]).state == ClaimState.UNCERTAIN
    assert OutboundMessage.objects.get(pk=history["row"]).state == OutboundState.UNREACHABLE
    # a proposal is read, not decided
    page = auditor.get(reverse("admin:tools_proposal_change", args=[history["proposal"]])).content.decode()
    assert 'id="proposal-decision"' not in page
    auditor.post(reverse("admin:tools_proposal_apply", args=[history["proposal"]]))
    assert Proposal.objects.get(pk=history["proposal"]).state == ProposalState.PENDING
    assert counts == {name: type(obj).objects.count() for name, obj in objects().items()}  # nothing deleted


def test_an_auditor_cannot_open_channels_agent_keys_or_users(auditor, history):
    channel = Channel.objects.get(slug="tg")
    for url in (reverse("admin:conversations_channel_changelist"),
                reverse("admin:conversations_channel_change", args=[channel.pk]),
                reverse("admin:conversations_agentkey_changelist"),
                reverse("admin:conversations_agentkey_change", args=[AgentKey.objects.get().pk]),
                reverse("admin:conversations_conversation_changelist"),
                reverse("admin:auth_user_changelist")):
        assert auditor.get(url).status_code == 403, url


# --- operators ---------------------------------------------------------------------------------

def test_an_operator_edits_a_channel_without_seeing_its_secrets(operator, history):
    channel = Channel.objects.get(slug="tg")
    url = reverse("admin:conversations_channel_change", args=[channel.pk])
    page = operator.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert BOT_TOKEN not in html and WEBHOOK_SECRET not in html and 'type="password"' in html
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None}
    data.update({"telegram_bot_token": "", "telegram_webhook_secret": "", "agent_config": '{"url": "https://a.example.com"}',
                 "window_closed": "0.7", **NO_RULES})
    response = operator.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    channel.refresh_from_db()
    settings = channel.platform_settings
    assert (settings["bot_token"], settings["webhook_secret"], channel.window_closed) == (BOT_TOKEN, WEBHOOK_SECRET, 0.7)
    operator.post(url, {**data, "telegram_bot_token": "42:NEW", "forget_telegram_webhook_secret": "on"})
    channel.refresh_from_db()
    assert (channel.platform_settings["bot_token"], channel.platform_settings.get("webhook_secret", "")) == ("42:NEW", "")
    assert operator.get(reverse("admin:conversations_channel_add")).status_code == 200


def test_an_operator_follows_a_duplicate_to_its_claim_turn_and_conversation(operator, history):
    duplicate = CaughtDuplicate.objects.get(kind="duplicate_prevented")
    page = operator.get(reverse("admin:audit_caughtduplicate_change", args=[duplicate.pk])).content.decode()
    claim_url = reverse("admin:tools_actionclaim_change", args=[history["claim"]])
    assert claim_url in page
    claim = operator.get(claim_url).content.decode()
    turn = Turn.objects.get()
    assert reverse("admin:conversations_turn_change", args=[turn.pk]) in claim
    assert reverse("admin:conversations_conversation_change", args=[history["conversation"]]) in claim
    assert "?target=claim+" in claim  # → the duplicates it caught
    pages = [operator.get(reverse("admin:conversations_conversation_change", args=[history["conversation"]])),
             operator.get(reverse("admin:conversations_turn_change", args=[turn.pk])),
             operator.get(reverse("admin:delivery_unreachablechat_change", args=[UnreachableChat.objects.get().pk]))]
    links = [href for page in pages for href in re.findall(r'href="([^"]+\?[^"]+)"', page.content.decode())
             if "/admin/" in href]
    assert len(links) >= 7
    for href in links:  # filtered lists of what belongs to the conversation, the turn, the chat
        assert operator.get(unescape(href)).status_code == 200, href
    for name in ("conversations_channel", "conversations_agentkey", "conversations_contextnote", *AUDITED):
        assert operator.get(reverse(f"admin:{name}_changelist")).status_code == 200, name


# --- URL lookups: only the listed filters ---------------------------------------------------------

PROBES = [
    ("audit_auditevent", "summary__startswith=a"), ("audit_auditevent", "summary__regex=^(a+)+$"),
    ("audit_auditevent", "extra__contains=x"), ("audit_auditevent", "extra__tool=calendar_create_event"),
    ("audit_caughtduplicate", "extra__contains=x"), ("audit_caughtduplicate", "summary__icontains=a"),
    ("tools_actionclaim", "error__regex=."), ("tools_actionclaim", "arguments__contains=x"),
    ("tools_actionclaim", "result__icontains=a"), ("tools_proposal", "error__startswith=a"),
    ("tools_proposal", "claim__arguments__contains=x"), ("delivery_outboundmessage", "last_error__regex=^a"),
    ("delivery_outboundmessage", "text__startswith=h"), ("delivery_unreachablechat", "error__startswith=a"),
]


@pytest.mark.parametrize("page, lookup", PROBES)
def test_an_auditor_cannot_query_stored_texts_through_url_lookups(auditor, history, page, lookup):
    """An auditor could otherwise read an error text or an event's extra a character at a
    time (and on SQLite `__regex` runs Python's `re` in the web process)."""
    response = auditor.get(reverse(f"admin:{page}_changelist") + "?" + lookup)
    assert response.status_code == 400, (page, lookup)


def test_the_listed_filters_and_the_products_own_links_still_work(auditor, history):
    channel = Channel.objects.get(slug="tg")
    year = timezone.now().year
    allowed = [
        ("audit_auditevent", f"kind__exact=duplicate_prevented&channel_slug__exact=tg&at__year={year}"),
        ("audit_auditevent", f"conversation_id={history['conversation']}"),
        ("audit_caughtduplicate", f"target=claim {history['claim']}"),
        ("tools_actionclaim", "state=done"), ("tools_actionclaim", "state__exact=done&live__exact=1"),
        ("tools_actionclaim", f"conversation_id={history['conversation']}&action__exact=calendar_create_event"),
        ("tools_proposal", "state__exact=pending&claim__action__exact=calendar_create_event"),
        ("delivery_outboundmessage", f"channel__id__exact={channel.pk}&age=24h&needs_marker__exact=0"),
        ("delivery_outboundmessage", f"conversation__id__exact={history['conversation']}"),
        ("delivery_outboundmessage", f"channel__id__exact={channel.pk}&chat_id=101"),
        ("delivery_unreachablechat", f"channel__id__exact={channel.pk}"),
    ]
    for page, query in allowed:
        response = auditor.get(reverse(f"admin:{page}_changelist") + "?" + query)
        assert response.status_code == 200, (page, query)
        assert "?e=1" not in response.get("Location", ""), (page, query)
