"""The cluster's hosts from a test: scripts/cluster.sh with a prefix, addresses and data
folder of the test's own (a cluster brought up by hand keeps its own), and the
cluster's database read back over the bridge, as an operator would."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import host_network

BASE_DIR = Path(__file__).resolve().parents[2]
SCRIPT = BASE_DIR / "scripts" / "cluster.sh"
WEB_PORT = 8000
HOSTS = ("db", "app-a", "app-b")
APPS = ("app-a", "app-b")


class ClusterError(Exception):
    pass


class Cluster:
    def __init__(self, prefix="alct", net="10.214", env=None):
        self.prefix, self.net = prefix, net
        self.dir = None  # made by up(): under /tmp, where the postgres user may enter
        self.ours = False  # whether `down` is ours to run
        self.env = {**os.environ, "CLUSTER_PREFIX": prefix, "CLUSTER_NET": net, **(env or {})}

    @property
    def root_address(self):
        """The bridge's address in the root namespace: the load generator, the fake Bot API."""
        return f"{self.net}.0.1"

    def address(self, host):
        return {"db": f"{self.net}.0.2", "app-a": f"{self.net}.0.11", "app-b": f"{self.net}.0.12"}[host]

    def web_url(self, host):
        return f"http://{self.address(host)}:{WEB_PORT}"

    @property
    def database_url(self):
        """The cluster's database as the root namespace reaches it (over the bridge)."""
        return f"postgres://postgres@{self.address('db')}:5432/agentloop"

    def script(self, *args, timeout=120):
        done = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ClusterError(f"cluster.sh {' '.join(args)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def unavailable(self):
        """Why the cluster cannot be built here (not root, no network namespaces), or ''."""
        with host_network.changing():  # the check adds and removes a probe bridge
            done = subprocess.run([str(SCRIPT), "check"], env=self.env, capture_output=True, text=True, timeout=30)
        return "" if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())

    def up(self):
        self.dir = tempfile.mkdtemp(prefix="agentloop-cluster-test-", dir="/tmp")
        self.env["CLUSTER_DIR"] = self.dir
        try:
            with host_network.changing():  # the bridge's address appears in the root namespace
                output = self.script("up", timeout=180)
        except ClusterError as error:
            # A cluster with this prefix up already (another run, or one killed before its
            # `down`) is refused, and never taken down from under its owner.
            self.ours = "is up already" not in str(error)
            raise
        self.ours = True
        return output

    def down(self):
        try:
            if self.ours:
                with host_network.changing():  # the bridge's address goes
                    return self.script("down", timeout=60)
        finally:
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self, host):
        self.script("kill", host, timeout=30)

    def start(self, host):
        self.script("start", host, timeout=120)

    def unplug(self, host):
        self.script("unplug", host, timeout=10)

    def plug(self, host):
        self.script("plug", host, timeout=10)

    def status(self):
        return self.script("status", timeout=30)

    def manage(self, *args, **env):
        """manage.py in the root namespace, on the cluster's database."""
        subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, check=True, capture_output=True,
                       timeout=120, env={**self.env, "DATABASE_URL": self.database_url, **env})

    def keep_logs(self, into):
        """Copy the hosts' logs (web, worker, tasks, PostgreSQL) before `down` removes them."""
        into = Path(into)
        if not self.dir:
            return into
        for log in Path(self.dir).glob("*/*.log"):
            (into / log.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(log, into / log.parent.name / log.name)
        pg_log = Path(self.dir) / "db" / "pg" / "server.log"
        if pg_log.exists():
            shutil.copy(pg_log, into / "db" / "postgresql.log")
        return into
