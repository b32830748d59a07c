"""The failpoint helper, in child processes: an armed point kills its own process with
SIGKILL (on the hit it names), anything not armed is a no-op."""

import os
import signal
import subprocess
import sys

from tests.conftest import BASE_DIR

HITS = """
import sys
from audit.failpoints import failpoint
for name in sys.argv[1:]:
    print("reached", name, flush=True)
    failpoint(name)
print("survived", flush=True)
"""


def run(code, *args, armed=None, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "AGENTLOOP_FAILPOINT"}
    full_env.update(env)
    if armed is not None:
        full_env["AGENTLOOP_FAILPOINT"] = armed
    return subprocess.run([sys.executable, "-c", code, *args], cwd=BASE_DIR, env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_unarmed_points_do_nothing():
    done = run(HITS, "ledger.after_send", "tool.after_effect")
    assert done.returncode == 0 and done.stdout.endswith("survived\n"), done.stderr
    other = run(HITS, "ledger.after_send", "tool.after_effect", armed="turn.after_answer")
    assert other.returncode == 0 and other.stdout.endswith("survived\n"), other.stderr


def test_an_armed_point_kills_its_process_with_sigkill():
    died = run(HITS, "tool.after_claim", "ledger.after_send", "turn.after_answer", armed="ledger.after_send")
    assert died.returncode == -signal.SIGKILL
    assert died.stdout.splitlines() == ["reached tool.after_claim", "reached ledger.after_send"]
    assert "failpoint ledger.after_send: killing process" in died.stderr


def test_the_nth_hit_and_a_list_of_points():
    third = run(HITS, *["ledger.after_send"] * 5, armed="inbound.after_insert, ledger.after_send@3")
    assert third.returncode == -signal.SIGKILL
    assert third.stdout.splitlines() == ["reached ledger.after_send"] * 3
    first_of_list = run(HITS, "ledger.after_send", "inbound.after_insert",
                        armed="inbound.after_insert,ledger.after_send@3")
    assert first_of_list.returncode == -signal.SIGKILL
    assert first_of_list.stdout.splitlines() == ["reached ledger.after_send", "reached inbound.after_insert"]


def test_unset_it_is_an_empty_set_read_once():
    code = ("import os; from audit import failpoints\n"
            "os.environ['AGENTLOOP_FAILPOINT'] = 'ledger.after_send'\n"
            "failpoints.failpoint('ledger.after_send')\n"
            "print(sorted(failpoints._armed), failpoints.parse('a, b@2 ,'))")
    done = run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] {'a': 1, 'b': 2}"


AFTER_COMMIT = """
import sys, django
django.setup()
from django.db import transaction
from audit.failpoints import after_commit
try:
    with transaction.atomic():
        after_commit("flush.after_claim")
        raise RuntimeError("rolled back")
except RuntimeError:
    print("rolled back, alive", flush=True)
with transaction.atomic():
    after_commit("flush.after_claim")
    print("inside, alive", flush=True)
print("survived", flush=True)
"""


def test_after_commit_fires_only_once_the_transaction_commits(tmp_path):
    died = run(AFTER_COMMIT, armed="flush.after_claim", DJANGO_SETTINGS_MODULE="agentloop.settings",
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert died.stdout.splitlines() == ["rolled back, alive", "inside, alive"]
