"""The REST API for external agents: tools, invoke, the guard-only claim API, audit
events, auth and bad input. Real concurrency over HTTP is in test_guard_e2e."""

import io
import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.utils import timezone

from conversations.models import AgentKey
from tools.models import ActionClaim, CalendarEvent, ToolPolicy

pytestmark = pytest.mark.django_db
EVENT = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}


@pytest.fixture
def shop(make_channel):
    return make_channel("shop")


@pytest.fixture
def key(shop, agent_key):
    return agent_key(shop, name="shop-agent")


@pytest.fixture
def conversation(shop, make_conversation):
    return make_conversation(shop, "ana")


def call(client, method, url, body=None, *, key=None, raw=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    if method == "get":
        return client.get(url, body or {}, **headers)
    data = raw if raw is not None else body
    if raw is None:
        import json

        data = json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **headers)


def invoke(client, key, name, body):
    return call(client, "post", f"/api/v1/tools/{name}/invoke", body, key=key)


def test_tools_are_listed_as_openai_functions(client, key):
    ToolPolicy.objects.create(name="email_send", approval="operator")
    response = call(client, "get", "/api/v1/tools", key=key)
    assert response.status_code == 200
    tools = {t["function"]["name"]: t for t in response.json()}
    assert set(tools) >= {"calendar_create_event", "calendar_list_events", "calendar_delete_event", "email_send"}
    create = tools["calendar_create_event"]
    assert create["type"] == "function" and create["effect"] == "create" and create["guarded"] is True
    assert create["function"]["parameters"]["required"] == ["title", "start_datetime"]
    assert tools["calendar_list_events"]["guarded"] is False
    assert tools["email_send"]["approval"] == "operator" and tools["email_send"]["requires_approval"] is True


def test_invoke_then_the_duplicate_with_note_and_original(client, key, conversation):
    first = invoke(client, key, "calendar_create_event", {"conversation": conversation.pk, "arguments": EVENT})
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "done" and first.json()["duplicate"] is False
    second = invoke(client, key, "calendar_create_event", {
        "conversation": conversation.pk, "arguments": {**EVENT, "end_datetime": "2026-12-01T11:00"}})
    body = second.json()
    assert second.status_code == 200 and body["duplicate"] is True and body["status"] == "duplicate"
    assert "already carried out" in body["note"]
    assert body["result"] == first.json()["result"] and body["original"]["claim"] == first.json()["claim"]
    assert CalendarEvent.objects.count() == 1


def test_invoke_with_an_explicit_scope(client, key, agent_key, shop):
    body = {"scope": "customer-42", "arguments": EVENT}
    assert invoke(client, key, "calendar_create_event", body).json()["status"] == "done"
    assert invoke(client, key, "calendar_create_event", body).json()["status"] == "duplicate"
    other = agent_key(shop, name="other-agent")  # scopes are per agent key
    assert invoke(client, other, "calendar_create_event", body).json()["status"] == "done"
    assert CalendarEvent.objects.count() == 2


def test_invoke_under_approval_is_202(client, key, conversation):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator")
    response = invoke(client, key, "calendar_create_event", {"conversation": conversation.pk, "arguments": EVENT})
    assert response.status_code == 202 and response.json()["status"] == "awaiting_approval"
    assert response.json()["proposal"] and not CalendarEvent.objects.exists()


def test_guard_only_claim_api(client, key, conversation):
    body = {"action": "refund", "conversation": conversation.pk, "arguments": {"order": "A-1", "amount": 30}}
    first = call(client, "post", "/api/v1/actions/claim", body, key=key)
    assert first.status_code == 201 and first.json()["status"] == "proceed"
    claim = first.json()["claim"]
    busy = call(client, "post", "/api/v1/actions/claim", body, key=key)
    assert busy.status_code == 409 and busy.json()["status"] == "in_progress"
    done = call(client, "post", f"/api/v1/actions/{claim}/succeed", {"result": {"refund": "R9"}}, key=key)
    assert done.status_code == 200 and done.json()["state"] == "done"
    dup = call(client, "post", "/api/v1/actions/claim", body, key=key)
    assert dup.status_code == 200 and dup.json()["duplicate"] is True and dup.json()["result"] == {"refund": "R9"}
    assert call(client, "post", f"/api/v1/actions/{claim}/fail", {"error": "x"}, key=key).status_code == 409


def test_guard_only_fail_then_retry(client, key):
    body = {"action": "book_table", "scope": "table-4", "arguments": {"day": "fri"}, "fingerprint": ["day"]}
    claim = call(client, "post", "/api/v1/actions/claim", body, key=key).json()["claim"]
    failed = call(client, "post", f"/api/v1/actions/{claim}/fail", {"error": "closed"}, key=key)
    assert failed.status_code == 200 and failed.json()["state"] == "released"
    assert call(client, "post", "/api/v1/actions/claim", body, key=key).status_code == 201


def test_audit_events_for_monitoring(client, key, conversation, agent_key, make_channel):
    for _ in range(2):
        invoke(client, key, "calendar_create_event", {"conversation": conversation.pk, "arguments": EVENT})
    response = call(client, "get", "/api/v1/audit/events", {"kind": "duplicate_prevented"}, key=key)
    assert response.status_code == 200
    [event] = response.json()
    assert event["kind"] == "duplicate_prevented" and event["conversation"] == conversation.pk
    assert event["extra"]["tool"] == "calendar_create_event"
    stranger = agent_key(make_channel("elsewhere"), name="stranger")
    assert call(client, "get", "/api/v1/audit/events", key=stranger).json() == []
    bad = call(client, "get", "/api/v1/audit/events", {"kind": "nonsense"}, key=key)
    assert bad.status_code == 400 and "unknown kind" in bad.json()["fields"]["kind"][0]
    since = call(client, "get", "/api/v1/audit/events", {"since": timezone.now().isoformat()}, key=key)
    assert since.json() == []


# --- auth ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url, method", [
    ("/api/v1/tools", "get"), ("/api/v1/tools/calendar_create_event/invoke", "post"),
    ("/api/v1/actions/claim", "post"), ("/api/v1/actions/1/succeed", "post"), ("/api/v1/audit/events", "get"),
])
def test_missing_invalid_or_revoked_key_is_401(client, key, url, method):
    assert call(client, method, url, {}).status_code == 401
    assert call(client, method, url, {}, key="al_not-a-key").status_code == 401
    AgentKey.objects.update(revoked_at=timezone.now())
    response = call(client, method, url, {}, key=key)
    assert response.status_code == 401 and "revoked" in response.json()["error"]
    assert not ActionClaim.objects.exists()


def test_another_agents_conversation_and_claims_are_404(client, key, conversation, agent_key, make_channel):
    stranger = agent_key(make_channel("elsewhere"), name="stranger")
    response = invoke(client, stranger, "calendar_create_event", {"conversation": conversation.pk, "arguments": EVENT})
    assert response.status_code == 404 and "no conversation" in response.json()["error"]
    claim = call(client, "post", "/api/v1/actions/claim",
                 {"action": "refund", "scope": "c", "arguments": {}}, key=key).json()["claim"]
    assert call(client, "post", f"/api/v1/actions/{claim}/succeed", {"result": 1}, key=stranger).status_code == 404
    assert call(client, "post", "/api/v1/actions/999999/fail", {"error": "x"}, key=key).status_code == 404
    assert not CalendarEvent.objects.exists()


@pytest.mark.parametrize("url, body, message", [
    ("/api/v1/tools/calendar_create_event/invoke", None, "JSON parse error"),
    ("/api/v1/tools/calendar_create_event/invoke", {"arguments": EVENT}, "exactly one of"),
    ("/api/v1/tools/calendar_create_event/invoke", {"scope": "s", "conversation": 1, "arguments": EVENT},
     "exactly one of"),
    ("/api/v1/tools/calendar_create_event/invoke", {"scope": "s", "arguments": "title=x"}, "invalid request"),
    ("/api/v1/tools/calendar_create_event/invoke", {"scope": "s", "arguments": {"title": "x"}},
     "start_datetime"),
    ("/api/v1/tools/calendar_create_event/invoke", {"scope": "s", "arguments": {**EVENT, "start_datetime": "mañana"}},
     "not an ISO 8601"),
    ("/api/v1/tools/email_send/invoke", {"scope": "s", "arguments": {"to": "nobody", "subject": "s", "body": "b"}},
     "not an email address"),
    ("/api/v1/actions/claim", {"action": "has spaces", "scope": "s", "arguments": {}}, "invalid request"),
    ("/api/v1/actions/claim", {"action": "refund", "scope": "s", "arguments": {}, "fingerprint": "amount"},
     "invalid request"),
    ("/api/v1/actions/claim", {"action": "refund", "scope": "s"}, "invalid request"),
])
def test_malformed_bodies_are_400_with_a_message_and_leave_no_claim(client, key, url, body, message):
    response = call(client, "post", url, body, key=key, raw="{not json" if body is None else None)
    assert response.status_code == 400, response.content
    assert message in str(response.json())
    assert not ActionClaim.objects.exists() and not CalendarEvent.objects.exists()


def test_unknown_or_switched_off_tool_is_404(client, key):
    assert invoke(client, key, "launch_rockets", {"scope": "s", "arguments": {}}).status_code == 404
    ToolPolicy.objects.create(name="email_send", enabled=False)
    response = invoke(client, key, "email_send", {"scope": "s", "arguments": {"to": "a@b.co", "subject": "s",
                                                                              "body": "b"}})
    assert response.status_code == 404 and "switched off" in response.json()["error"]
    names = [t["function"]["name"] for t in call(client, "get", "/api/v1/tools", key=key).json()]
    assert "email_send" not in names


def test_oversized_body_is_413(client, key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = invoke(client, key, "email_send", {"scope": "s", "arguments": {"to": "a@b.co", "subject": "s",
                                                                              "body": "x" * 5000}})
    assert response.status_code == 413 and not ActionClaim.objects.exists()


# --- the schema and its docs -------------------------------------------------------------------


def test_the_openapi_schema_validates_without_warnings():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = out.getvalue()
    for path in ("/api/v1/tools/{name}/invoke", "/api/v1/actions/claim", "/api/v1/actions/{claim}/succeed",
                 "/api/v1/audit/events", "/api/v1/channels/{slug}/messages"):
        assert path in schema


def test_the_docs_page_uses_no_cdn(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    # No asset from another host (a CSRF token in the page may well contain "cdn").
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)
    assert "jsdelivr" not in html and "unpkg" not in html and "cdnjs" not in html
    assets = re.findall(r'(?:src|href)="/static/([^"]+)"', html)
    assert len(assets) >= 3 and all(finders.find(asset) for asset in assets)  # shipped with the app
