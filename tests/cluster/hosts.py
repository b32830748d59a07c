"""The cluster's hosts from a test: scripts/cluster.sh with a prefix, addresses and data
folder of the test's own (a cluster brought up by hand keeps its own), and the
cluster's database read back over the bridge, as an operator would."""

import contextlib
import datetime
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from tests.support import host_network

BASE_DIR = Path(__file__).resolve().parents[2]
SCRIPT = BASE_DIR / "scripts" / "cluster.sh"
WEB_PORT = 8000
HOSTS = ("db", "app-a", "app-b")
APPS = ("app-a", "app-b")
HA_HOSTS = ("dcs", "db-a", "db-b", "app-a", "app-b")  # `up --ha` (scripts/cluster-ha.sh)
DATABASE_HOSTS = ("db-a", "db-b")
PATRONI_PORT = 8008


# A `down` waits for the browser tests alive to end before it changes the root
# namespace's network (host_network.WAIT_SECONDS at most), then removes the hosts.
DOWN_TIMEOUT = host_network.WAIT_SECONDS + 60
# The clusters being removed in threads of this process (Cluster.down(wait=False)).
removing: list = []


def wait_removed():
    """Every cluster this process is removing, removed (at the end of a pytest session)."""
    for thread in removing:
        thread.join(DOWN_TIMEOUT)


class ClusterError(Exception):
    pass


class Cluster:
    def __init__(self, prefix="alct", net="10.214", env=None, ha=False):
        self.prefix, self.net, self.ha = prefix, net, ha
        self.dir = None  # made by up(): under /tmp, where the postgres user may enter
        self.ours = False  # whether `down` is ours to run
        self.owner = None  # the prefix's owner lock, held from up() to the end of down()
        # The script takes host_network's locks itself, only while the root namespace's
        # network changes (scripts/cluster.sh network_change).
        host_network.VAR.mkdir(exist_ok=True)
        self.env = {**os.environ, "CLUSTER_PREFIX": prefix, "CLUSTER_NET": net,
                    "CLUSTER_NETWORK_LOCKS": str(host_network.VAR), **(env or {})}

    @property
    def root_address(self):
        """The bridge's address in the root namespace: the load generator, the fake Bot API."""
        return f"{self.net}.0.1"

    def address(self, host):
        return {"db": f"{self.net}.0.2", "db-a": f"{self.net}.0.2", "db-b": f"{self.net}.0.4", "dcs": f"{self.net}.0.3",
                "app-a": f"{self.net}.0.11", "app-b": f"{self.net}.0.12"}[host]

    def web_url(self, host):
        return f"http://{self.address(host)}:{WEB_PORT}"

    @property
    def database_url(self):
        """The cluster's database as the root namespace reaches it (over the bridge); with
        --ha, both database hosts, libpq keeping the one that takes writes."""
        if self.ha:
            return (f"postgres://postgres@{self.address('db-a')}:5432,{self.address('db-b')}:5432/agentloop"
                    "?target_session_attrs=read-write")
        return f"postgres://postgres@{self.address('db')}:5432/agentloop"

    def script(self, *args, timeout=120):
        done = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ClusterError(f"cluster.sh {' '.join(args)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def unavailable(self):
        """Why the cluster cannot be built here (not root, no network namespaces), or ''.
        (Its probes change nothing in the root namespace: no lock.)"""
        done = subprocess.run([str(SCRIPT), "check"], env=self.env, capture_output=True, text=True, timeout=30)
        return "" if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())

    def up(self):
        """The hosts built; a cluster of this prefix left by a run killed before its `down`
        is taken down first, and one whose owner still lives is waited for."""
        self.owner = owner_lock(self.prefix)
        self.dir = tempfile.mkdtemp(prefix="agentloop-cluster-test-", dir="/tmp")
        self.env["CLUSTER_DIR"] = self.dir
        self.ours = True
        if self.built():
            # Its owner is gone (we hold the lock): a SIGKILLed run, a session cut short.
            print(f"cluster: prefix {self.prefix!r} was left up by a run that died; taking it down",
                  file=sys.stderr)
            self.script("down", timeout=DOWN_TIMEOUT)
        return self.script("up", *(["--ha"] if self.ha else []), timeout=240)

    def built(self):
        """Whether namespaces or the bridge of this prefix exist on the machine."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout.split()
        bridge = subprocess.run(["ip", "link", "show", f"{self.prefix}-br"], capture_output=True, timeout=10)
        return f"{self.prefix}-db" in names or f"{self.prefix}-dcs" in names or bridge.returncode == 0

    def down(self, wait=True):
        """Every process of the hosts stopped now; the hosts and the bridge removed now, or
        with wait=False in a thread of this process (`removing`), which its end waits for:
        the removal waits for the browser tests alive to end (host_network), and the next
        test need not wait with it."""
        try:
            if self.ours:
                self.script("stop", timeout=60)
        except BaseException:
            self._remove()
            raise
        if wait:
            self._remove()
        else:
            thread = threading.Thread(target=self._remove, name=f"cluster {self.prefix} down")  # not a daemon
            removing.append(thread)
            thread.start()

    def _remove(self):
        try:
            if self.ours:
                self.script("down", timeout=DOWN_TIMEOUT)
        finally:
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            if self.owner:
                self.owner.close()  # the next run may build the prefix again
                self.owner = None

    @contextlib.contextmanager
    def running(self, logs):
        """Up for the `with` block; its hosts' logs copied into `logs`, then down."""
        try:
            self.up()
            yield self
        finally:
            self.keep_logs(logs)
            self.down(wait=False)

    def kill(self, host):
        self.script("kill", host, timeout=30)

    def start(self, host):
        self.script("start", host, timeout=120)

    def unplug(self, host):
        self.script("unplug", host, timeout=10)

    def plug(self, host):
        self.script("plug", host, timeout=10)

    def pgkill(self, host):
        """SIGKILL a database host's PostgreSQL (--ha): Patroni, left running, fails over."""
        self.script("pgkill", host, timeout=10)

    def primary(self):
        """The database host Patroni's REST API calls primary now (--ha), or None."""
        for host in DATABASE_HOSTS:
            if self.role_is(host, "primary"):
                return host
        return None

    def role_is(self, host, role):
        """Patroni's health endpoints: 200 from /primary on the primary, from /sync on a
        synchronous replica that streams."""
        try:
            with urllib.request.urlopen(f"http://{self.address(host)}:{PATRONI_PORT}/{role}", timeout=1):
                return True
        except OSError:
            return False

    def redis(self, action):
        self.script("redis", action, timeout=20)

    def status(self):
        return self.script("status", timeout=30)

    def manage(self, *args, **env):
        """manage.py in the root namespace, on the cluster's database."""
        subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, check=True, capture_output=True,
                       timeout=120, env={**self.env, "DATABASE_URL": self.database_url, **env})

    def patroni_says(self, host, since):
        """What a db host's Patroni logged since `since` (a time.time()) about whether it
        could fail over: the lines that give its reason, for a test's report."""
        log = Path(self.dir) / host / "patroni.log"
        reasons = re.compile(r"replication lag|Request failed|not healthy|wal_position|is behind|list is empty"
                             r"|Failing over|[Ll]ock|crash|starting as")
        said = []
        for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
            with contextlib.suppress(ValueError):
                when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if since <= when < since + 20 and reasons.search(line) and "Lock owner" not in line:
                    said.append(line[24:224])
        return " | ".join(list(dict.fromkeys(said))[:8]) or "(nothing about it in its log)"

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


# Machine-wide, not in the clone: two clones' runs on one machine share the prefix, the
# namespaces and the addresses. The kernel drops the lock with its holder's last file
# descriptor, so a run that dies holding it (SIGKILL, a cut session) frees it, and a
# cluster found up under a free lock is one nobody owns any more.
OWNER_LOCKS = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
OWNER_WAIT_SECONDS = 600  # longer than a whole cluster test, up and down included


def owner_lock(prefix, wait=OWNER_WAIT_SECONDS):
    """The open file holding the prefix's owner lock (close it to release), or ClusterError
    when another live run keeps it longer than `wait`."""
    path = OWNER_LOCKS / f"agentloop-cluster-{prefix}.lock"
    try:
        return host_network.open_locked(path, fcntl.LOCK_EX, wait=wait, poll=0.2)
    except TimeoutError:
        raise ClusterError(f"the cluster prefix {prefix!r} stayed owned by another live run "
                           f"for {wait} s ({path})") from None
