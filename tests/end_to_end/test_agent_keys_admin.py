"""Agent keys issued and revoked in the admin (issue 53), through the real web server with
an operator logged in: the key is made by the function `manage.py createagentkey` uses,
shown once on the page after the form (never again: only its hash is kept), works against
the API, and a revoked key is refused. Both are on the audit trail."""

import hashlib
import re
from contextlib import closing

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session

from audit.models import AuditEvent, EventKind
from conversations.models import AgentKey
from tests.support import local_http
from tests.support.e2e import operator_session

pytestmark = pytest.mark.e2e
PASSWORD = "pw-olga-keys-1"
KEYS = "/admin/conversations/agentkey/"
SECRET = re.compile(r"al_[A-Za-z0-9_-]{20,}")


def post_form(session, path, data):
    return session.post(path, data={**data, "csrfmiddlewaretoken": session.cookies["csrftoken"]})


def inbound(web, raw, message_id):
    return local_http.post(f"{web.url}/api/v1/channels/shop/messages", headers={"Authorization": f"Bearer {raw}"},
                           json={"message_id": message_id, "contact": "ana", "text": "¿tienen talla 38?"})


def test_a_key_issued_in_the_admin_is_shown_once_works_and_once_revoked_is_refused(processes, make_channel):
    shop = make_channel("shop", kind="api")
    make_channel("elsewhere", kind="api")
    User.objects.create_superuser("olga", "olga@example.com", PASSWORD)
    web = processes.web()
    with closing(operator_session(web, "olga", PASSWORD)) as admin:
        assert admin.get(KEYS).status_code == 200
        form = admin.get(f"{KEYS}add/")
        assert form.status_code == 200 and 'name="name"' in form.text and 'name="channels"' in form.text

        added = post_form(admin, f"{KEYS}add/", {"name": "helpdesk", "channels": [shop.pk]})
        key = AgentKey.objects.get()
        assert added.status_code == 302 and added.headers["location"] == f"{KEYS}{key.pk}/issued/"
        shown = admin.get(added.headers["location"])
        assert shown.status_code == 200
        raw = SECRET.findall(shown.text)
        assert len(set(raw)) == 1, shown.text
        raw = raw[0]

        # Stored hashed, granted the channel chosen, and nowhere else: not in the session either.
        assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest() and raw.startswith(key.prefix)
        assert list(key.channels.values_list("slug", flat=True)) == ["shop"]
        assert not [s for s in Session.objects.all() if raw in str(s.get_decoded())]
        again = admin.get(f"{KEYS}{key.pk}/issued/")
        assert again.status_code == 200 and not SECRET.search(again.text) and "shown once" in again.text
        assert not SECRET.search(admin.get(f"{KEYS}{key.pk}/change/").text)

        assert inbound(web, raw, "m1").status_code == 202
        issued = AuditEvent.objects.get(kind=EventKind.AGENT_KEY_ISSUED)
        assert (issued.actor, issued.target) == ("admin:olga", f"agent key {key.pk}")
        assert raw not in str(issued.extra) + issued.summary

        revoked = post_form(admin, KEYS, {"action": "revoke", "_selected_action": [key.pk]})
        assert revoked.status_code == 302
    refused = inbound(web, raw, "m2")
    assert refused.status_code == 401, refused.text
    event = AuditEvent.objects.get(kind=EventKind.AGENT_KEY_REVOKED)
    assert (event.actor, event.target) == ("admin:olga", f"agent key {key.pk}")
    assert AgentKey.objects.get().revoked_at is not None
