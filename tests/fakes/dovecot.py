"""A real IMAP server for the email platform's tests: Dovecot (the Debian package
dovecot-imapd, scripts/system-deps.sh), configured in a temporary folder — a passwd-file
user, a Maildir, plain IMAP on a free loopback port — and run as an unprivileged user
that owns the folder (`nobody` when the tests run as root). Started once per test
session (`shared()`), restartable mid-test (`restart()`: the email e2e's "the real server
restarted mid-burst"). Mail reaches the inbox by IMAP APPEND, so IDLE sees it as it would
a delivery."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path

from imapclient import IMAPClient

from tests.conftest import free_port

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"
USER, PASSWORD = "bot@shop.test", "imap-pass-w0rd"

CONFIG = """\
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
login_trusted_networks = 127.0.0.0/8
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = {uid}
last_valid_uid = {uid}
first_valid_gid = {gid}
last_valid_gid = {gid}
mail_location = maildir:{root}/mail/%u
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {root}/passwd
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
service stats {{
  unix_listener stats-reader {{
    user = {user}
  }}
  unix_listener stats-writer {{
    user = {user}
  }}
}}
"""


class Dovecot:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dovecot-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        account = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
        self.uid, self.gid, self.user = account.pw_uid, account.pw_gid, account.pw_name
        group = subprocess.run(["id", "-gn", self.user], capture_output=True, text=True).stdout.strip()
        for folder in ("run", "state", "mail"):
            (self.root / folder).mkdir()
        (self.root / "passwd").write_text(f"{USER}:{{PLAIN}}{PASSWORD}:{self.uid}:{self.gid}::{self.root}/mail/{USER}\n")
        (self.root / "dovecot.conf").write_text(CONFIG.format(root=self.root, user=self.user, group=group,
                                                              uid=self.uid, gid=self.gid, port=self.port))
        for path in (self.root, *self.root.rglob("*")):
            os.chown(path, self.uid, self.gid)

    @property
    def log(self) -> str:
        path = self.root / "dovecot.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> Dovecot:
        as_root = os.geteuid() == 0
        self.proc = subprocess.Popen([DOVECOT, "-F", "-c", str(self.root / "dovecot.conf")], cwd=self.root,
                                     user=self.uid if as_root else None, group=self.gid if as_root else None,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dovecot exited: {self.proc.stderr.read().decode(errors='replace')}\n{self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as probe:
                    probe.settimeout(2)
                    if probe.recv(100).startswith(b"* OK"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"dovecot did not answer on {self.port}\n{self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # The whole process group, as systemd stops a unit: every IMAP process ends now
            # (says BYE), not when it next notices its master is gone.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        """The server stopped (every open connection dropped) and started again on the same port."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if not os.environ.get("DOVECOT_KEEP"):  # its folder (the log) kept for a look
            shutil.rmtree(self.root, ignore_errors=True)

    # --- what a test does to the mailbox --------------------------------------------------
    def client(self) -> IMAPClient:
        client = IMAPClient("127.0.0.1", port=self.port, ssl=False, timeout=10)
        client.login(USER, PASSWORD)
        return client

    def deliver(self, *messages: bytes | EmailMessage, folder: str = "INBOX") -> None:
        """Mail arriving: appended to the folder (what IDLE reports as EXISTS)."""
        with self.client() as client:
            for message in messages:
                client.append(folder, bytes(message) if isinstance(message, EmailMessage) else message)

    def empty(self, folder: str = "INBOX") -> None:
        """Every message removed (a test's own mailbox state; UIDs go on rising)."""
        with self.client() as client:
            client.select_folder(folder)
            uids = client.search("ALL")
            if uids:
                client.delete_messages(uids)
                client.expunge()

    def recreate(self) -> None:
        """The server's index rebuilt (stopped, its UID lists and indexes removed, started
        again): the mailbox's UIDVALIDITY changes, its mails keep their content and get
        new UIDs."""
        self.stop()
        home = self.root / "mail" / USER
        for path in home.glob("dovecot*"):
            if path.is_file():
                path.unlink()
        self.start()


def mail(sender: str, text: str, subject: str = "Reserva", *, message_id: str = "", in_reply_to: str = "",
         references: str = "", to: str = USER, attachments: tuple[tuple[str, str, bytes], ...] = (),
         headers: dict[str, str] | None = None) -> EmailMessage:
    """A plain mail as a person's client sends it."""
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = sender, to, subject
    message["Message-ID"] = message_id or make_msgid(domain="client.test")
    message["Date"] = format_datetime(__import__("datetime").datetime.now(__import__("datetime").timezone.utc))
    if in_reply_to:
        message["In-Reply-To"] = in_reply_to
    if references:
        message["References"] = references
    for name, value in (headers or {}).items():
        message[name] = value
    message.set_content(text)
    for name, content_type, data in attachments:
        major, minor = content_type.split("/")
        message.add_attachment(data, maintype=major, subtype=minor, filename=name)
    return message


_shared: Dovecot | None = None


def shared() -> Dovecot:
    """The session's one Dovecot, started on first use, stopped when the tests end."""
    global _shared
    if _shared is None:
        _shared = Dovecot().start()
        atexit.register(_shared.close)
    elif _shared.proc is None or _shared.proc.poll() is not None:
        _shared.start()
    return _shared
