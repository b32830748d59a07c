"""The crash matrix: each named fault point (audit/failpoints.py) in turn kills the real
process that reaches it (SIGKILL), which is then started again; afterwards nothing may
be lost, no reply may arrive twice unlabelled, and every intended action has happened
exactly once.

One run per point, on its own channel of the local fake Telegram Bot API:
  1. a fresh web server (daphne) and worker (`manage.py runloop`), the process that
     owns the point started with AGENTLOOP_FAILPOINT naming it;
  2. three chats write (two plain questions — one of them the caption of a photo the
     worker fetches and stores before its turn runs —, one asking to book — a guarded
     calendar call); for the approval point the booking is proposed and an operator applies it
     in the admin. Webhook deliveries are retried like Telegram does (the same update
     again until a 2xx);
  3. the armed process dies at the point and is started again without it;
  4. once quiet, the booking chat asks again (a person told "part of it may be done"
     checks and asks again; the guard must not do it twice) and a plain chat writes
     again;
  5. counted from what the fake Bot API received and the calendar: lost messages
     (acknowledged, never answered), unlabelled duplicate replies, labelled resends,
     recovery notices, calendar events (want exactly 1), the photo's file (want one,
     stored). The booking's reply carries its .ics as a file (sendDocument), counted
     like a text by its caption and bytes.

Used by `python -m tests.faults` (both databases, prints the table) and by
tests/end_to_end/test_crash_matrix.py (the suite's database). Django must be set up on the
database the processes use.
"""

import collections
import time
from dataclasses import dataclass, field

import httpx

from audit.failpoints import ENV, POINTS
from tests.support import local_http
from tests.support.e2e import SECRET, update

AGENT = "crash=tests.faults.agent.CrashAgent"
OPERATOR = ("crash-operator", "crash-operator-pw")
WEB_POINTS = {"inbound.after_insert", "approval.between_steps"}  # the rest die in the worker
QUIET_TIMEOUT = 45.0


def process_for(point):
    return "web" if point in WEB_POINTS else "worker"


# A 1×1 PNG: the photo chat B sends with its first question.
PHOTO = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                      "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")


@dataclass
class Result:
    point: str
    database: str
    lost: int = 0
    unlabelled: int = 0
    labelled: int = 0
    notices: int = 0
    effects: int = 0
    expected_effects: int = 1
    seconds: float = 0.0
    problems: list = field(default_factory=list)

    @property
    def ok(self):
        return (not self.problems and self.lost == 0 and self.unlabelled == 0
                and self.effects == self.expected_effects)


@dataclass
class Message:
    chat_id: int
    tag: str  # unique; the agent's reply quotes it
    update: dict
    acknowledged: bool = False
    dropped: int = 0  # deliveries that got no 2xx


class PointRun:
    """One fault point on its own channel, with its own processes."""

    def __init__(self, servers, fake, database, index, point):
        self.servers, self.fake, self.point = servers, fake, point
        self.result = Result(point, database)
        self.slug = f"crash-{index}"
        self.token = f"{7100 + index}:CRASH-{index}"
        self.chats = {name: 10_000 * (index + 1) + n for n, name in enumerate("ABC", 1)}
        self.messages: list[Message] = []
        self.armed_role = process_for(point)
        self.procs = {}
        self.died = False

    # --- processes ------------------------------------------------------------------

    def start(self):
        """The shared clean server of the other role, and a fresh armed one of this."""
        self.servers.retire(self.armed_role)  # one worker: the restart is what recovers
        if self.point == "approval.between_steps":
            self.servers.retire("worker")  # it must read the approval policy afresh
        other = "web" if self.armed_role == "worker" else "worker"
        self.procs[other] = self.servers.clean(other)
        self.procs[self.armed_role] = self.servers.start(self.armed_role, self.point)

    def revive(self):
        """Start again whatever died; the armed process's death is the planned crash."""
        for role, proc in list(self.procs.items()):
            code = proc.popen.poll()
            if code is None:
                continue
            if not proc.armed:
                self.result.problems.append(f"{role} died unplanned (exit {code})")
            elif code != -9 or f"failpoint {self.point}: killing" not in proc.output():
                self.result.problems.append(f"{role} ended with {code}, not at the point")
            else:
                self.died = True
            self.procs[role] = self.servers.clean(role)

    def stop(self):
        """An armed process that never reached its point is not left running."""
        proc = self.procs.get(self.armed_role)
        if proc is not None and proc.armed:
            proc.stop()

    # --- the workload -----------------------------------------------------------------

    def deliver(self, chat, text, photo=False):
        """POST one update to the webhook; on no 2xx send the same update again, like
        Telegram (a crashed web server is started again meanwhile). `photo`: the text is
        the caption of a photo the fake Bot API serves."""
        tag = text[text.rindex("["):]
        message = Message(self.chats[chat], tag, update(self.chats[chat], text))
        if photo:
            sent = message.update["message"]
            sent["caption"] = sent.pop("text")
            sent["photo"] = [{**self.fake.add_file(self.token, PHOTO), "width": 1, "height": 1}]
        self.messages.append(message)
        for attempt in range(20):
            try:
                response = local_http.post(f"{self.procs['web'].url}/webhooks/telegram/{self.slug}/",
                                      json=message.update, timeout=10,
                                      headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
                if 200 <= response.status_code < 300:
                    message.acknowledged = True
                    return message
            except httpx.HTTPError:
                pass
            message.dropped += 1
            if self.procs["web"].popen.poll() is None:
                time.sleep(min(0.1 * 2 ** attempt, 2.0))  # Telegram backs off too
            self.revive()
        return message

    def write(self, phase):
        self.deliver("A", f"How are you today? [{self.point} A{phase}]")
        if phase == 1:  # with a photo: the worker fetches and stores it before the turn runs
            self.deliver("B", f"What time do you open? [{self.point} B{phase}]", photo=True)
        self.deliver("C", f"Please book my check-up #book [{self.point} C{phase}]")

    def operator(self):
        client = httpx.Client(base_url=self.procs["web"].url, timeout=30)
        client.get("/admin/login/")
        response = client.post("/admin/login/", data={
            "username": OPERATOR[0], "password": OPERATOR[1], "next": "/admin/",
            "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        assert response.status_code == 302, response.text[:300]
        return client

    def apply_pending(self):
        """An operator applies each proposal of this channel waiting for a decision."""
        from tools.models import Proposal, ProposalState

        for pk in Proposal.objects.filter(claim__channel_slug=self.slug, state=ProposalState.PENDING) \
                .values_list("pk", flat=True):
            client = self.operator()
            try:
                client.post(f"/admin/tools/proposal/{pk}/apply/",
                            data={"csrfmiddlewaretoken": client.cookies["csrftoken"]})
            except httpx.HTTPError:
                pass  # the armed web server died while applying: the point under test
            finally:
                client.close()

    # --- waiting ------------------------------------------------------------------------

    def busy(self):
        """What is still under way on this channel (empty once quiet)."""
        from conversations.models import BufferState, MessageBuffer, Turn, TurnState
        from delivery.models import OutboundMessage, OutboundState
        from tools.models import Proposal, ProposalState

        reasons = []
        if MessageBuffer.objects.filter(conversation__channel__slug=self.slug, state=BufferState.OPEN).exists():
            reasons.append("a buffer is open")
        if Turn.objects.filter(conversation__channel__slug=self.slug,
                               state__in=[TurnState.READY, TurnState.RUNNING]).exists():
            reasons.append("a turn is ready or running")
        if OutboundMessage.objects.filter(channel__slug=self.slug, state__in=[
                OutboundState.PENDING, OutboundState.ATTEMPTING, OutboundState.FAILED]).exists():
            reasons.append("a reply is not delivered")
        if Proposal.objects.filter(claim__channel_slug=self.slug, state=ProposalState.APPLYING).exists():
            reasons.append("a proposal is applying")
        return reasons

    def wait_quiet(self, what):
        deadline = time.monotonic() + QUIET_TIMEOUT
        while reasons := self.busy():
            self.revive()
            if time.monotonic() > deadline:
                self.result.problems.append(f"not quiet {what} after {QUIET_TIMEOUT:.0f}s: {', '.join(reasons)}")
                return
            time.sleep(0.05)

    def wait_for_death(self):
        """Until the armed process has died at its point and been started again (a
        webhook delivery may have seen it happen already)."""
        deadline = time.monotonic() + 30
        while not self.died:
            if time.monotonic() > deadline:
                self.result.problems.append(f"{self.point} was never reached")
                return
            time.sleep(0.05)
            self.revive()

    # --- the run ------------------------------------------------------------------------

    def run(self):
        began = time.monotonic()
        self.start()
        try:
            self.write(phase=1)
            if self.point == "approval.between_steps":
                self.wait_quiet("before the operator applies")
                self.apply_pending()
            self.wait_for_death()
            self.wait_quiet("after the restart")
            self.write(phase=2)
            self.wait_quiet("after asking again")
            if self.point == "approval.between_steps":
                self.apply_pending()  # the new proposal, or the interrupted one given back
                self.wait_quiet("after applying again")
            self.count()
        finally:
            self.stop()
        if self.point == "inbound.after_insert" and not any(m.dropped for m in self.messages):
            self.result.problems.append("no webhook delivery was refused")
        self.result.seconds = round(time.monotonic() - began, 1)
        return self.result

    # --- counting -----------------------------------------------------------------------

    def count(self):
        from conversations.engine import RECOVERY_NOTICE
        from conversations.models import Contact
        from delivery.ledger import RECOVERY_PREFIX
        from tools.models import CalendarEvent

        sent = collections.defaultdict(list)
        for call in self.fake.calls(token=self.token):
            if call.method == "sendMessage":
                sent[int(call.params["chat_id"])].append(str(call.params["text"]))
            elif call.method == "sendDocument":  # the booking's .ics, its caption naming the turn
                upload = call.params["document"]
                sent[int(call.params["chat_id"])].append(f"{call.params.get('caption', '')} [{upload['sha256']}]")
        result = self.result
        for texts in sent.values():
            plain = collections.Counter(t for t in texts if not t.startswith(RECOVERY_PREFIX))
            result.unlabelled += sum(n - 1 for n in plain.values())
            result.labelled += len(texts) - sum(plain.values())
        result.problems += [f"{m.tag} was never acknowledged" for m in self.messages if not m.acknowledged]
        for chat_id in self.chats.values():
            texts = sent.get(chat_id, [])
            unanswered = [m for m in self.messages if m.chat_id == chat_id and m.acknowledged
                          and not any(m.tag in t for t in texts)]
            notices = sum(1 for t in texts if t.removeprefix(RECOVERY_PREFIX) == RECOVERY_NOTICE)
            result.notices += notices
            # A recovery notice answers a message whose turn was not re-run (it had acted).
            result.lost += max(0, len(unanswered) - notices)
        contact = Contact.objects.get(channel__slug=self.slug, platform_id=str(self.chats["C"]))
        result.effects = CalendarEvent.objects.filter(calendar__scope=f"contact:{contact.pk}").count()
        from conversations.models import MediaFile, MediaState

        files = list(MediaFile.objects.filter(channel__slug=self.slug).values_list("state", flat=True))
        if files != [MediaState.STORED]:
            result.problems.append(f"the photo's file is {files}, not one stored")


def prepare():
    """The matrix's fixed rows: a short claim lease (an interrupted call is looked up
    within seconds, not minutes) and the operator who applies proposals."""
    from django.contrib.auth import get_user_model

    from tools.models import ToolPolicy

    ToolPolicy.objects.update_or_create(name="calendar_create_event",
                                        defaults={"timeout_seconds": 1, "approval": "none"})
    User = get_user_model()
    if not User.objects.filter(username=OPERATOR[0]).exists():
        User.objects.create_superuser(OPERATOR[0], "crash-operator@example.com", OPERATOR[1])


def make_channel(fake, slug, token):
    from conversations.models import Channel

    fake.add_token(token)
    windows = {name: 0.2 for name in ("window_closed", "window_greeting", "window_open", "window_neutral")}
    return Channel.objects.create(slug=slug, kind="telegram", platform_settings={
        "bot_token": token, "webhook_secret": SECRET, "api_base": fake.url},
        agent="crash", typing_mode="never", **windows)


class Servers:
    """The web server and worker shared by the points: each point replaces the one of
    the role it arms, and the clean process started after the crash stays for the next."""

    def __init__(self, processes):
        self.processes = processes
        self.clean_ones = {}

    def start(self, role, armed=""):
        env = {ENV: armed, "AGENTLOOP_EXTRA_AGENTS": AGENT, "LOG_LEVEL": "WARNING",
               "AGENTLOOP_MEDIA_ROOT": self.processes.log_dir / "files"}
        proc = self.processes.web(**env) if role == "web" else self.processes.worker(**env)
        proc.armed = armed
        return proc

    def clean(self, role):
        proc = self.clean_ones.get(role)
        if proc is None or proc.popen.poll() is not None:
            proc = self.clean_ones[role] = self.start(role)
        return proc

    def retire(self, role):
        proc = self.clean_ones.pop(role, None)
        if proc is not None:
            proc.stop()

    def stop(self):
        for role in list(self.clean_ones):
            self.retire(role)


def run_point(servers, fake, database, point):
    from tools.models import ToolPolicy

    index = POINTS.index(point)
    prepare()
    run = PointRun(servers, fake, database, index, point)
    make_channel(fake, run.slug, run.token)
    approval = "operator" if point == "approval.between_steps" else "none"
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval=approval)
    try:
        return run.run()
    finally:
        ToolPolicy.objects.filter(name="calendar_create_event").update(approval="none")


def run_all(processes, fake, database, points=POINTS, report=None):
    """Every point in turn on the database Django is set up on; their results."""
    servers = Servers(processes)
    results = []
    try:
        for point in points:
            result = run_point(servers, fake, database, point)
            if report is not None:
                report(row(result))
            results.append(result)
    finally:
        servers.stop()
    return results


# --- the table -----------------------------------------------------------------------------

COLUMNS = ("point", "database", "lost", "unlabelled dups", "labelled resends", "notices", "effects", "s", "")


def row(r):
    verdict = "ok" if r.ok else "FAIL " + "; ".join(r.problems)
    return (r.point, r.database, str(r.lost), str(r.unlabelled), str(r.labelled), str(r.notices),
            f"{r.effects}/{r.expected_effects}", f"{r.seconds:.0f}", verdict)


def table(rows):
    rows = [COLUMNS, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)
