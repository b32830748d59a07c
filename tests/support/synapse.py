"""A real Matrix homeserver for the Matrix tests: Synapse (matrix-synapse from PyPI, in a
venv of its own that scripts/synapse.sh makes), SQLite, no federation (only the client
listener, on a loopback port), users registered with the shared secret
(`/_synapse/admin/v1/register`). Started once per test session and shared
(`synapse_server` in tests/end_to_end/test_matrix_e2e.py); each test registers its own
bot and rooms. Rate limits are Synapse's own (`rc_message`), set high for everyone here;
a test that wants the 429 path gives its bot a low limit of its own through the admin
API (`override_ratelimit`), which Synapse applies to that user's sends."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import httpx

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "agentloop.test"
SHARED_SECRET = "synapse-tests-registration-secret"

CONFIG = """\
server_name: "{server_name}"
pid_file: "{dir}/homeserver.pid"
listeners:
  - port: {port}
    bind_addresses: ["127.0.0.1"]
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{dir}/homeserver.db"
log_config: "{dir}/log.yaml"
media_store_path: "{dir}/media"
signing_key_path: "{dir}/signing.key"
registration_shared_secret: "{secret}"
macaroon_secret_key: "{macaroon}"
form_secret: "{form}"
report_stats: false
enable_metrics: false
trusted_key_servers: []
suppress_key_server_warning: true
federation_domain_whitelist: []
presence:
  enabled: false
url_preview_enabled: false
rc_message:
  per_second: 1000
  burst_count: 1000
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
rc_joins_per_room: {{per_second: 1000, burst_count: 1000}}
rc_room_creation: {{per_second: 1000, burst_count: 1000}}
rc_registration: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
rc_login:
  address: {{per_second: 1000, burst_count: 1000}}
  account: {{per_second: 1000, burst_count: 1000}}
rc_admin_redaction: {{per_second: 1000, burst_count: 1000}}
"""

LOG = """\
version: 1
formatters:
  plain: {format: "%(asctime)s %(name)s %(levelname)s %(message)s"}
handlers:
  file: {class: logging.FileHandler, filename: "DIR/homeserver.log", formatter: plain}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
"""


def synapse_python() -> str:
    """The python of Synapse's venv, made (or kept) by scripts/synapse.sh."""
    done = subprocess.run([str(ROOT / "scripts" / "synapse.sh")], capture_output=True, text=True, timeout=900,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


class Synapse:
    """One homeserver: `.url`, `register(name)`, `restart()`."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.port = directory, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.python = synapse_python()
        self.process: subprocess.Popen[bytes] | None = None
        self.config = self.dir / "homeserver.yaml"
        self.config.write_text(CONFIG.format(server_name=SERVER_NAME, dir=self.dir, port=self.port,
                                             secret=SHARED_SECRET, macaroon=secrets.token_hex(16),
                                             form=secrets.token_hex(16)))
        (self.dir / "log.yaml").write_text(LOG.replace("DIR", str(self.dir)))
        # The server's signing key, as `--generate-keys` writes it (an ed25519 seed, unpadded
        # base64) without starting Synapse once more for it.
        seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        (self.dir / "signing.key").write_text(f"ed25519 a_test {seed}\n")

    def __enter__(self) -> Synapse:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.process = subprocess.Popen([self.python, "-m", "synapse.app.homeserver", "-c", str(self.config)],
                                        stdout=(self.dir / "stdout.log").open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.dir / "homeserver.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/_matrix/client/versions", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("Synapse did not answer within 90 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Killed (as a crash would: Synapse's graceful stop waits for its open long polls,
        seconds) and started again on the same port and database."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.start()

    def register(self, name: str, admin: bool = False) -> tuple[str, str]:
        """A new user by the shared secret: (user id, access token)."""
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        nonce = httpx.get(endpoint, timeout=10).json()["nonce"]
        password = secrets.token_hex(8)
        mac = hmac.new(SHARED_SECRET.encode(), b"\x00".join(
            [nonce.encode(), name.encode(), password.encode(), b"admin" if admin else b"notadmin"]), hashlib.sha1)
        answer = httpx.post(endpoint, json={"nonce": nonce, "username": name, "password": password, "admin": admin,
                                            "mac": mac.hexdigest()}, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        return body["user_id"], body["access_token"]


class User:
    """A person on the homeserver, driving the conversation through the client-server API."""

    def __init__(self, server: Synapse, user_id: str, token: str) -> None:
        self.server, self.user_id, self.token = server, user_id, token
        self.txn = 0

    def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> httpx.Response:
        return httpx.request(method, f"{self.server.url}/_matrix/client/v3{path}", json=body, params=params,
                             headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def ok(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> dict:
        answer = self.call(method, path, body, params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def create_room(self, *invite: str, encrypted: bool = False, name: str = "") -> str:
        body: dict = {"invite": list(invite), "preset": "private_chat"}
        if name:
            body["name"] = name
        if encrypted:
            body["initial_state"] = [{"type": "m.room.encryption", "state_key": "",
                                      "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]
        return str(self.ok("POST", "/createRoom", body)["room_id"])

    def join(self, room: str) -> None:
        self.ok("POST", f"/join/{quote(room, safe='')}", {})

    def members(self, room: str) -> set[str]:
        joined = self.ok("GET", f"/rooms/{quote(room, safe='')}/joined_members")["joined"]
        return set(joined)

    def send(self, room: str, event_type: str, content: dict) -> str:
        self.txn += 1
        path = f"/rooms/{quote(room, safe='')}/send/{event_type}/t{time.time_ns()}.{self.txn}"
        return str(self.ok("PUT", path, content)["event_id"])

    def say(self, room: str, text: str, **content: object) -> str:
        return self.send(room, "m.room.message", {"msgtype": "m.text", "body": text, **content})

    def react(self, room: str, event_id: str, key: str) -> str:
        return self.send(room, "m.reaction", {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id,
                                                               "key": key}})

    def typing(self, room: str) -> list[str]:
        """Who the homeserver says is typing in `room` now (an initial sync's ephemeral events)."""
        # Each request its own (a filter with a nonce): Synapse answers a sync the same as an
        # earlier one from its response cache for two minutes.
        only = {"room": {"rooms": [room], "timeline": {"limit": 0}, "state": {"types": []}},
                "account_data": {"types": [f"x.nonce.{time.time_ns()}"]}}
        joined = self.ok("GET", "/sync", params={"timeout": 0, "filter": json.dumps(only)}).get("rooms", {}).get("join", {})
        return [user for event in joined.get(room, {}).get("ephemeral", {}).get("events", [])
                if event["type"] == "m.typing" for user in event["content"].get("user_ids", [])]

    def kick(self, room: str, user_id: str) -> None:
        self.ok("POST", f"/rooms/{quote(room, safe='')}/kick", {"user_id": user_id})

    def events(self, room: str, sender: str = "", event_type: str = "m.room.message") -> list[dict]:
        """The room's events of that type (by `sender` when given), oldest first."""
        found = self.ok("GET", f"/rooms/{quote(room, safe='')}/messages", params={"dir": "b", "limit": 200})["chunk"]
        return [event for event in reversed(found) if event["type"] == event_type
                and (not sender or event["sender"] == sender)]


def limit_messages(admin: User, user_id: str, per_second: float, burst: int) -> None:
    """Synapse's rc_message for one user (its admin API): the 429 path made real."""
    answer = httpx.post(f"{admin.server.url}/_synapse/admin/v1/users/{quote(user_id, safe='')}/override_ratelimit",
                        json={"messages_per_second": per_second, "burst_count": burst},
                        headers={"Authorization": f"Bearer {admin.token}"}, timeout=30)
    assert answer.status_code == 200, answer.text
