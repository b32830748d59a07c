"""Production settings: `check --deploy` clean with the documented environment, the
generated secret key readable by its owner only, `testserver` not a default host, and
`make run` that does not switch DEBUG on by itself (with a loud warning when asked for
on an address others can reach)."""

import os
import shutil
import signal
import subprocess
import sys

from agentloop.core.secret_file import read_or_create_secret_key
from tests.conftest import BASE_DIR, run_python, wait_until

# The production environment README.md documents ("Running in production").
PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "a-long-random-production-key-0123456789-abcdefghijklmnopqrstuvwxyz",
    "ALLOWED_HOSTS": "agentloop.example.com",
    "HTTPS": "true",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "AGENTLOOP_TRUSTED_PROXIES": "10.0.0.2",
}

# Whatever the developer's shell or .env says, these start from their defaults.
SWITCHES = ("DEBUG", "HTTPS", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
            "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD",
            "SECURE_PROXY_SSL_HEADER", "ALLOWED_HOSTS", "SECRET_KEY", "AGENTLOOP_LOCAL_SECRET_KEY", "HOST",
            "AGENTLOOP_TRUSTED_PROXIES")


def run(args, **env):
    base = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    return run_python(args, env={**base, "DJANGO_SETTINGS_MODULE": "agentloop.settings", **env}, timeout=120)


def test_check_deploy_is_clean_with_the_documented_production_environment():
    result = run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
    assert "WARNING" not in result.stderr


def test_check_deploy_warns_behind_a_proxy_it_does_not_trust():
    """A proxy in front (SECURE_PROXY_SSL_HEADER) and no trusted proxy: every client would be
    the proxy's address, and the login lockout would lock a username out for everyone."""
    untrusted = {**PRODUCTION_ENV, "AGENTLOOP_TRUSTED_PROXIES": ""}
    result = run([sys.executable, "manage.py", "check", "--deploy"], **untrusted)
    assert "agentloop.W001" in result.stderr and "AGENTLOOP_TRUSTED_PROXIES" in result.stderr, result.stderr


def test_a_trusted_proxy_that_is_not_an_address_or_a_network_stops_the_start():
    """uvicorn would compare such an entry as a name, silently: a typo would trust nobody,
    or the wrong hosts."""
    for wrong in ("10.0.0.1/8", "proxy.example.com", "*"):
        shown = run([sys.executable, "-c", "import django; django.setup()"], AGENTLOOP_TRUSTED_PROXIES=wrong)
        assert shown.returncode != 0 and f"AGENTLOOP_TRUSTED_PROXIES: {wrong!r}" in shown.stderr, shown.stderr


def test_the_loopback_laptop_path_keeps_https_switches_off():
    """Off by default (plain HTTP on 127.0.0.1): check --deploy names exactly what to set."""
    result = run([sys.executable, "manage.py", "check", "--deploy"], DEBUG="false")
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):  # HSTS, redirect, cookies
        assert check in result.stderr, result.stderr


def test_defaults_are_not_debug_and_do_not_trust_testserver():
    shown = run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                 "print(settings.DEBUG, settings.ALLOWED_HOSTS)"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "False ['127.0.0.1', 'localhost', '[::1]', '127.0.0.1']"


def test_the_generated_secret_key_file_is_readable_by_its_owner_only(tmp_path):
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "var" / "secret_key"
        key = read_or_create_secret_key(path)
        assert len(key) == 50
        assert path.stat().st_mode & 0o777 == 0o600
        assert read_or_create_secret_key(path) == key  # stable across restarts
        assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # no draft left behind

        path.chmod(0o644)  # written by an older version with the umask's mode
        assert read_or_create_secret_key(path) == key
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old_umask)


def checkout_copy(tmp_path):
    """The project's settings in a checkout of their own (its own var/, no secret_key in it
    yet); the apps still imported from this one."""
    shutil.copytree(BASE_DIR / "agentloop", tmp_path / "agentloop", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def settle(checkout, **env):
    """Django set up in `checkout`, with only the given switches."""
    base = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    return subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                           "print(len(settings.SECRET_KEY))"], cwd=checkout, timeout=120, capture_output=True, text=True,
                          env={**base, "DJANGO_SETTINGS_MODULE": "agentloop.settings", "PYTHONPATH": f"{checkout}:{BASE_DIR}",
                               "DATABASE_URL": f"sqlite:///{checkout}/db.sqlite3", **env})


def test_without_secret_key_a_production_start_fails_loudly_and_make_run_generates_one(tmp_path):
    checkout = checkout_copy(tmp_path)
    refused = settle(checkout, DEBUG="false")
    assert refused.returncode != 0
    assert "SECRET_KEY" in refused.stderr and "every host" in refused.stderr, refused.stderr
    assert not (checkout / "var" / "secret_key").exists()  # no per-host key made up on the way
    # `make run` says it is the laptop path; so does DEBUG.
    commands = subprocess.run(["make", "-n", "run"], cwd=BASE_DIR, capture_output=True, text=True,
                              env={**os.environ, "MAKEFLAGS": ""}, timeout=60).stdout
    assert "AGENTLOOP_LOCAL_SECRET_KEY=true" in commands, commands
    made = settle(checkout, AGENTLOOP_LOCAL_SECRET_KEY="true")
    assert made.returncode == 0 and made.stdout.strip() == "50", made.stderr
    # The commands of that checkout (addchannel, createuser…) use the key `make run` made.
    assert settle(checkout).returncode == 0
    assert settle(checkout, SECRET_KEY="k" * 60).stdout.strip() == "60"


def test_make_run_does_not_switch_debug_on():
    commands = subprocess.run(["make", "-n", "run"], cwd=BASE_DIR, capture_output=True, text=True,
                              env={**os.environ, "MAKEFLAGS": ""}, timeout=60).stdout
    assert "manage.py runall" in commands
    assert "DEBUG" not in commands, commands


def test_runall_warns_loudly_about_debug_on_an_address_others_can_reach(tmp_path):
    from tests.conftest import free_port

    log = open(tmp_path / "runall.log", "wb")
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    proc = subprocess.Popen([sys.executable, "manage.py", "runall", "--host", "0.0.0.0", "--port", str(free_port())],
                            cwd=BASE_DIR, env={**env, "DEBUG": "true", "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output = wait_until(lambda: (text := (tmp_path / "runall.log").read_text()) and "WARNING: DEBUG=true" in text
                            and text, timeout=30, message="the DEBUG warning")
    finally:
        # The warning is all this test needs: runall and its children (its own process
        # group, on an unmigrated database) go at once.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
    assert "0.0.0.0" in output and "not a loopback address" in output
