"""Hostile input at the admin and the console (docs/security.md): what anyone who can reach
the login page, or staff once logged in, can send, and what holds.

The login lockout behind a proxy (issue 51, finding 11b): django-axes locks a username
out per (username, client address), and the web server used to see every client at the
proxy's address, so five wrong passwords from anyone locked `admin` out for everyone. Now
the address a trusted proxy forwards (AGENTLOOP_TRUSTED_PROXIES) is the client's, and a
forwarded header from anyone else is not believed. Through the real web server: the test
is the proxy (its requests come from 127.0.0.1) and says whom it forwards for."""

import httpx
import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.e2e

PASSWORD = "Tr1cky-horse-Battery-81"
ATTACKER, ADMIN = "203.0.113.7", "198.51.100.2"  # documentation addresses (RFC 5737)


@pytest.fixture
def admin_user(transactional_db):
    return get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)


def log_in(web, password, forwarded_for=None):
    """The admin's login form, as a browser posts it, through a proxy that says whom it
    forwards for (`X-Forwarded-For`): the answer's status (302 logged in, 200 the form
    again, 429 locked out)."""
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    with httpx.Client(base_url=web.url, timeout=30, trust_env=False, headers=headers) as browser:
        browser.get("/admin/login/")
        return browser.post("/admin/login/", data={"username": "admin", "password": password, "next": "/admin/",
                                                   "csrfmiddlewaretoken": browser.cookies["csrftoken"]}).status_code


def locked_addresses():
    return set(AccessAttempt.objects.filter(failures_since_start__gte=settings.AXES_FAILURE_LIMIT)
               .values_list("ip_address", flat=True))


def test_an_attacker_behind_the_trusted_proxy_locks_out_only_their_own_address(processes, admin_user):
    web = processes.web(AGENTLOOP_TRUSTED_PROXIES="127.0.0.1,::1")
    # The attacker writes the admin's address into the header; the proxy appends the address
    # it saw. The client is the last address that is not a trusted proxy: the attacker's.
    tries = [log_in(web, "wrong-guess", f"{ADMIN}, {ATTACKER}") for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert tries == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]
    assert log_in(web, PASSWORD, ATTACKER) == 429  # locked out, even with the right password
    assert log_in(web, PASSWORD, ADMIN) == 302  # the admin, elsewhere, logs in
    assert locked_addresses() == {ATTACKER}


def test_a_forwarded_header_from_an_untrusted_peer_is_not_believed(processes, admin_user):
    """Trusted proxies configured, but this peer (127.0.0.1) is not one of them: a new
    forged address per try does not buy new tries."""
    web = processes.web(AGENTLOOP_TRUSTED_PROXIES="192.0.2.0/24")
    tries = [log_in(web, "wrong-guess", f"198.51.100.{n}") for n in range(settings.AXES_FAILURE_LIMIT + 1)]
    assert tries == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429, 429]
    assert locked_addresses() == {"127.0.0.1"}
