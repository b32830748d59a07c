"""A local Twilio Programmable Messaging API speaking the real protocol, driven by the
`twilio` library (conversations/platforms/sms/transport.py).

- POST /2010-04-01/Accounts/{AccountSid}/Messages.json, form-encoded, HTTP basic auth
  (Account SID, Auth Token; a wrong pair: 401, error 20003): To, From or
  MessagingServiceSid, Body (over 1,600 characters: 400, error 21617), MediaUrl (an MMS:
  up to 10), StatusCallback.
  201 with the Message resource (sid SM…, status "queued", num_segments as Twilio counts
  them). A number that opted out (`opt_out`): 400, error 21610. Scripted refusals
  (`fail_next`): a 429 with error 20429 and a Retry-After, a 5xx, any code.
- Then, as Twilio does, the status callbacks to the StatusCallback URL, each signed with
  X-Twilio-Signature (the library's RequestValidator, keyed by the Auth Token): sent, then
  delivered — or the fate `undeliver_next` scripted (undelivered or failed with an
  ErrorCode), after the ledger recorded the send.
- An MMS's file: GET …/Messages/{MM}/Media/{ME} with basic auth → 307 to the file's own
  address (/files/{ME}), served without credentials, as Twilio's storage does.
- A long code's throughput (1 message a second): a send more than half an interval ahead
  of that rate's schedule is counted (`over_rate`), as Twilio queues rather than refuses it.

Helpers build what Twilio POSTs to the product's webhook: `message_params` (an SMS or an
MMS), `signature`, `post`.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from twilio.request_validator import RequestValidator

from tests.fakes.server import FakeServer, TrackedHandler

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
AUTH_TOKEN = "twilio-auth-t0ken-0123456789abcd"
FROM = "+15005550006"
PERSON = "+56911112222"
BENCH_PUBLIC = "https://sms.bench.example"  # the bench's channel (tests/bench/platforms.py), its posts signed for it
MESSAGES = re.compile(r"^/2010-04-01/Accounts/(AC\w+)/Messages\.json$")
MEDIA = re.compile(r"^/2010-04-01/Accounts/(AC\w+)/Messages/(MM\w+)/Media/(ME\w+)$")


@dataclass
class Call:
    method: str  # create, media, file, callback
    path: str
    form: dict[str, list[str]]
    at: float = field(default_factory=time.monotonic)
    status: int = 0
    sid: str = ""  # the Message SID an accepted send got

    def value(self, name: str) -> str:
        return (self.form.get(name) or [""])[0]


@dataclass
class _Rule:
    status: int
    code: int
    times: int
    retry_after: float | None = None


def sid(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


class FakeTwilio(FakeServer):
    def __init__(self, *, per_second: float = 1.0, callback_delay: float = 0.05, report_status: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.per_second, self.callback_delay, self.report_status = per_second, callback_delay, report_status
        self._calls: list[Call] = []
        self._rules: list[_Rule] = []
        self._fates: list[tuple[str, int]] = []
        self._opted_out: set[str] = set()
        self._files: dict[str, tuple[bytes, str]] = {}
        self.callbacks: list[tuple[str, str, int]] = []  # (MessageSid, status, our webhook's answer)
        self.over_rate = 0
        self._due = 0.0  # the next send's theoretical time at the number's rate

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    # --- scripting ------------------------------------------------------------------------
    def fail_next(self, status: int = 500, code: int = 20500, times: int = 1, retry_after: float | None = None) -> None:
        with self._cond:
            self._rules.append(_Rule(status, code, times, retry_after))

    def undeliver_next(self, status: str = "undelivered", code: int = 30003) -> None:
        """The next accepted message's callbacks: sent, then `status` with ErrorCode `code`."""
        with self._cond:
            self._fates.append((status, code))

    def opt_out(self, number: str) -> None:
        with self._cond:
            self._opted_out.add(number)

    def media(self, data: bytes, content_type: str = "image/jpeg") -> str:
        """A file an MMS carries: its MediaUrl (fetched with the account's credentials)."""
        media_sid, message_sid = sid("ME"), sid("MM")
        with self._cond:
            self._files[media_sid] = (data, content_type)
        return f"{self.url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{message_sid}/Media/{media_sid}"

    # --- what happened --------------------------------------------------------------------
    def calls(self, method: str = "create") -> list[Call]:
        with self._cond:
            return [c for c in self._calls if c.method == method]

    def sent(self) -> list[Call]:
        """The messages accepted (201)."""
        return [c for c in self.calls("create") if c.status == 201]

    def texts(self) -> list[str]:
        return [c.value("Body") for c in self.sent()]

    def wait_for(self, method: str = "create", count: int = 1, timeout: float = 20.0) -> list[Call]:
        with self._cond:
            if not self._cond.wait_for(lambda: len([c for c in self._calls if c.method == method]) >= count, timeout):
                raise AssertionError(f"expected {count} {method} call(s) within {timeout}s, got "
                                     f"{len(self.calls(method))}")
            return [c for c in self._calls if c.method == method]

    def wait_for_callbacks(self, count: int, timeout: float = 20.0) -> list[tuple[str, str, int]]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.callbacks) >= count, timeout):
                raise AssertionError(f"expected {count} status callbacks within {timeout}s, got {self.callbacks}")
            return list(self.callbacks)

    # --- the server's answers ---------------------------------------------------------------
    def answer(self, verb: str, path: str, headers: Any, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        if verb == "GET" and path.startswith("/files/"):
            with self._cond:
                self._record(Call("file", path, {}, status=200))
                found = self._files.get(path.rsplit("/", 1)[-1])
            return (200, found[0], {"Content-Type": found[1]}) if found else _error(404, 20404, "not found")
        account = MESSAGES.match(path) or MEDIA.match(path)
        if account is None:
            return _error(404, 20404, "The requested resource was not found")
        if account.group(1) != ACCOUNT_SID or headers.get("Authorization") != _basic(ACCOUNT_SID, AUTH_TOKEN):
            with self._cond:
                self._record(Call("create" if verb == "POST" else "media", path, form, status=401))
            return _error(401, 20003, "Authenticate")
        if verb == "GET":
            with self._cond:
                self._record(Call("media", path, {}, status=307))
            return 307, b"", {"Location": f"{self.url}/files/{path.rsplit('/', 1)[-1]}"}
        return self._create(Call("create", path, form))

    def _create(self, call: Call) -> tuple[int, bytes, dict[str, str]]:
        with self._cond:
            rule = next((r for r in self._rules if r.times > 0), None)
            answer: tuple[int, bytes, dict[str, str]]
            to, text = call.value("To"), call.value("Body")
            if rule is not None:
                rule.times -= 1
                answer = _error(rule.status, rule.code, "scripted refusal")
                if rule.retry_after is not None:
                    answer[2]["Retry-After"] = f"{rule.retry_after:g}"
            elif not to:
                answer = _error(400, 21604, "A 'To' phone number is required.")
            elif not (call.value("From") or call.value("MessagingServiceSid")):
                answer = _error(400, 21603, "A 'From' phone number is required.")
            elif not text and not call.form.get("MediaUrl"):
                answer = _error(400, 21602, "Message body is required.")
            elif len(call.form.get("MediaUrl", [])) > 10:
                answer = _error(400, 21623, "Number of media files exceeds allowed limit.")
            elif len(text) > 1600:
                answer = _error(400, 21617, "The concatenated message body exceeds the 1600 character limit.")
            elif to in self._opted_out:
                answer = _error(400, 21610, "Attempt to send to unsubscribed recipient")
            else:
                answer = self._accept(call, to, text)
            call.status = answer[0]
            self._record(call)
            return answer

    def _accept(self, call: Call, to: str, text: str) -> tuple[int, bytes, dict[str, str]]:
        if self.per_second:  # Twilio's queue, as a cell rate: a send half an interval early is over the rate
            now, interval = time.monotonic(), 1 / self.per_second
            self.over_rate += now < self._due - interval / 2
            self._due = max(self._due, now) + interval
        message_sid = call.sid = sid("SM")
        from conversations.platforms.sms import segments  # the product's count (imported where Django is set up)

        cost = segments.count(text)
        fate = self._fates.pop(0) if self._fates else ("delivered", 0)
        callback = call.value("StatusCallback")
        if callback and self.report_status:
            threading.Thread(target=self._report, args=(callback, message_sid, to, fate), daemon=True).start()
        resource = {"sid": message_sid, "account_sid": ACCOUNT_SID, "to": to, "from": call.value("From") or None,
                    "messaging_service_sid": call.value("MessagingServiceSid") or None, "body": text,
                    "status": "queued", "num_segments": str(cost.segments), "num_media": str(len(call.form.get("MediaUrl", []))), "direction":
                    "outbound-api", "api_version": "2010-04-01", "price": None, "error_code": None,
                    "uri": f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{message_sid}.json"}
        return 201, json.dumps(resource).encode(), {"Content-Type": "application/json"}

    def _report(self, url: str, message_sid: str, to: str, fate: tuple[str, int]) -> None:
        """The status callbacks after an accepted message: sent, then its fate (signed)."""
        for status, code in (("sent", 0), fate):
            time.sleep(self.callback_delay)
            if self._stopping.is_set():
                return
            params = {"MessageSid": message_sid, "SmsSid": message_sid, "MessageStatus": status, "SmsStatus": status,
                      "AccountSid": ACCOUNT_SID, "From": FROM, "To": to, "ApiVersion": "2010-04-01"}
            if code:
                params["ErrorCode"] = str(code)
            try:
                answered = post(url, params, AUTH_TOKEN).status_code
            except httpx.HTTPError:
                answered = 0
            with self._cond:
                self.callbacks.append((message_sid, status, answered))
                self._cond.notify_all()

    def _record(self, call: Call) -> None:
        self._calls.append(call)
        self._cond.notify_all()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _error(status: int, code: int, message: str) -> tuple[int, bytes, dict[str, str]]:
    body = {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status}
    return status, json.dumps(body).encode(), {"Content-Type": "application/json"}


class _Handler(TrackedHandler):
    server: FakeTwilio

    def _serve(self, verb: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, payload, headers = self.server.answer(verb, urlsplit(self.path).path, self.headers, body)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


# --- what Twilio POSTs to the product ----------------------------------------------------------
def message_params(text: str, *, sender: str = PERSON, message_sid: str = "", media: tuple[tuple[str, str], ...] = (),
                   **extra: str) -> dict[str, str]:
    """An incoming SMS (an MMS with `media`: (url, content type) pairs) as Twilio's webhook
    sends it."""
    message_sid = message_sid or sid("MM" if media else "SM")
    params = {"ToCountry": "US", "SmsMessageSid": message_sid, "NumMedia": str(len(media)), "SmsSid": message_sid,
              "SmsStatus": "received", "Body": text, "To": FROM, "NumSegments": "1", "MessageSid": message_sid,
              "AccountSid": ACCOUNT_SID, "From": sender, "ApiVersion": "2010-04-01", "FromCountry": "CL"}
    for index, (url, kind) in enumerate(media):
        params[f"MediaUrl{index}"], params[f"MediaContentType{index}"] = url, kind
    return {**params, **extra}


def signature(url: str, params: dict[str, str], token: str = AUTH_TOKEN) -> str:
    return str(RequestValidator(token).compute_signature(url, params))


def post(url: str, params: dict[str, str], token: str | None = AUTH_TOKEN, *, signed_url: str = "",
         timeout: float = 10.0) -> httpx.Response:
    """POST `params` form-encoded as Twilio does, signed for `signed_url` (default `url`:
    behind a proxy, the public URL Twilio called); `token` None: unsigned."""
    headers = {"X-Twilio-Signature": signature(signed_url or url, params, token)} if token else {}
    return httpx.post(url, data=params, headers=headers, timeout=timeout)
