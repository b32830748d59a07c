"""Admin logins through the real login form: repeated failures lock a username out from
an address (django-axes), a success before the limit starts the count again; and
passwords set through the admin refuse common ones and ones like the user's own name."""

import pytest
from django.conf import settings
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db

PASSWORD = "Tr1cky-horse-Battery-81"


@pytest.fixture
def olga():
    return User.objects.create_user("olga", "olga@example.com", PASSWORD, is_staff=True, is_superuser=True)


def log_in(client, password, username="olga"):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password,
                                                       "next": "/admin/"})


def logged_in(client):
    return client.get("/admin/").status_code == 200


def test_repeated_failures_lock_the_login_out_and_a_success_starts_the_count_again(client, olga):
    limit = getattr(settings, "AXES_FAILURE_LIMIT", 5)  # the default, AGENTLOOP_LOGIN_FAILURE_LIMIT
    assert 3 <= limit <= 10
    for _ in range(limit - 1):
        assert log_in(client, "wrong-guess").status_code == 200  # the form again
    assert log_in(client, PASSWORD).status_code == 302 and logged_in(client)
    client.logout()

    for _ in range(limit - 1):  # the success reset the count: as many tries again
        assert log_in(client, "wrong-guess").status_code == 200
    locked = log_in(client, "wrong-guess")
    assert locked.status_code == 429 and b"too many" in locked.content.lower()
    # Locked out: even the right password does not log in now.
    assert log_in(client, PASSWORD).status_code == 429 and not logged_in(client)
    # Another username from the same address is not locked with it.
    User.objects.create_user("sam", "", PASSWORD, is_staff=True)
    assert log_in(client, PASSWORD, username="sam").status_code == 302


@pytest.mark.parametrize("new, refusal", [
    ("password123", "too common"),
    ("olga.example", "too similar"),
])
def test_the_admin_refuses_common_passwords_and_ones_like_the_users_own(client, olga, new, refusal):
    assert log_in(client, PASSWORD).status_code == 302
    response = client.post("/admin/password_change/", {"old_password": PASSWORD, "new_password1": new,
                                                        "new_password2": new})
    assert response.status_code == 200 and refusal in response.content.decode()
    olga.refresh_from_db()
    assert olga.check_password(PASSWORD)
