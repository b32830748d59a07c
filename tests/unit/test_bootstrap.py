"""`make run`'s bootstrap: its secrets are written owner-only from the first byte, the
admin password is set when the admin user is created and never again (a change made in
the admin stays), and it is printed once, when created."""

import os
import stat
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from conversations.management.commands.runall import Command as RunAll

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def var_dir(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path / "var"
    settings.STATIC_ROOT = tmp_path / "static"
    monkeypatch.delenv("ADMIN_PASSWORD", raising=False)
    return settings.VAR_DIR


def bootstrap():
    call_command("bootstrap", stdout=StringIO())


def banner():
    out = StringIO()
    RunAll(stdout=out).banner("127.0.0.1", 8000)
    return out.getvalue()


def read_env(var_dir):
    return dict(line.split("=", 1) for line in (var_dir / "bootstrap.env").read_text().splitlines())


def test_secrets_files_are_owner_only_from_the_first_byte(var_dir):
    var_dir.mkdir()
    # A bootstrap.env left by an older run (or copied) with the umask's mode, which someone
    # opened while it was readable: a file rewritten in place and chmodded afterwards hands
    # that reader the new secrets.
    old = var_dir / "bootstrap.env"
    old.write_text("admin_user=admin\n")
    old.chmod(0o644)
    previous_umask = os.umask(0)
    try:
        with open(old) as reader:
            bootstrap()
            assert "admin_password" not in reader.read()
    finally:
        os.umask(previous_umask)
    for name in ("bootstrap.env", "admin_password", "demo_agent_key"):
        assert stat.S_IMODE((var_dir / name).stat().st_mode) == 0o600, name
    assert read_env(var_dir)["demo_key"]


def test_the_admin_password_is_set_when_the_user_is_created_and_printed_then_only(var_dir, monkeypatch):
    monkeypatch.setenv("ADMIN_PASSWORD", "first-Password-4471")
    bootstrap()
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password("first-Password-4471") and admin.is_superuser
    assert "first-Password-4471" in banner()

    admin.set_password("changed-in-the-admin-9925")  # what an operator does on the admin's page
    admin.save()
    bootstrap()
    admin.refresh_from_db()
    assert admin.check_password("changed-in-the-admin-9925")
    again = banner()
    assert "first-Password-4471" not in again and "changed-in-the-admin" not in again
    assert "ADMIN_PASSWORD" in again  # where it came from, instead of the password
    assert "first-Password-4471" not in (var_dir / "bootstrap.env").read_text()


def test_a_generated_admin_password_is_kept_in_var_and_the_banner_says_so(var_dir):
    bootstrap()
    generated = (var_dir / "admin_password").read_text().strip()
    assert get_user_model().objects.get(username="admin").check_password(generated)
    assert generated in banner()
    bootstrap()
    again = banner()
    assert generated not in again and "var/admin_password" in again
