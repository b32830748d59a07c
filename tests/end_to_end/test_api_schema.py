"""The REST API is true to its OpenAPI schema (/api/schema/): schemathesis runs what
`schemathesis run --checks all --max-examples 25 --seed 1` runs (its examples, coverage,
fuzzing and stateful phases, every check) against the app in-process, on data that
exists: an api channel of a pull agent with messages and ready turns, an agent key.
The phases run as three tests (examples with coverage, fuzzing, stateful), so that the
suite's workers share them: one test of all four was the suite's longest (180 s in CI).

External agents generate their clients from the schema, so every answer an operation
gives must be documented (errors in the one shape), and the schema must say the real
constraints: a request it calls valid is accepted, one it calls invalid is refused."""

import time
import uuid
from datetime import timedelta

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.utils import timezone
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema
from schemathesis.transport.wsgi import WSGITransport

from conversations import flushing, timeline
from conversations.api.reading import ConversationMessagesQuery
from conversations.ingest import Inbound, admit

SEED = 1
EXAMPLES = 25
LONGEST_WAIT = ConversationMessagesQuery().fields["wait"].max_value  # a long poll's, in seconds
SLUG = "shop"
EDITED = "m0"  # a message the key's agent may edit


def cursors():
    """`format: cursor` is opaque: a client passes back a `next` it was given. These are
    cursors the API hands out (from the start; past a position), not random strings."""
    now = timezone.now()
    past = timeline.Position(now - timedelta(days=1), 0, 1)
    return st.sampled_from(["", timeline.Cursor().encode(), timeline.Cursor(boundary=past).encode()])


@pytest.fixture
def key(transactional_db, make_channel, agent_key):
    """The key, with data to act on: the view that reads conversations is async and reads
    in another thread, so the rows are committed (transactional_db)."""
    shop = make_channel(SLUG, kind="api", agent="pull")
    make_channel("elsewhere", kind="api")  # a channel this key may not use
    for n in range(4):
        admit(shop, Inbound(platform_message_id=f"m{n}", chat_id=f"c{n}", sender_id=f"c{n}",
                            text="¿Tienen hora el lunes?", reply_target=f"m{n}"))
    flushing.flush_due(timezone.now() + timedelta(minutes=1))  # ready turns, for a pull agent to claim
    return agent_key(shop, name="schemathesis")


@pytest.fixture
def in_process_transport(monkeypatch):
    """schemathesis 4.32.5 runs the app in-process (WSGI) here: its network transport
    cannot, as urllib3-future (caldav's niquests installs it in place of urllib3) has no
    `pools.keys()`. One of its in-process calls, the `ignored_auth` check's request
    without credentials, still carries the socket-level settings (`max_redirects`, ...)
    that werkzeug refuses; they mean nothing in-process, so they are dropped."""
    send = WSGITransport.send

    def send_in_process(self, case, *, session=None, **kwargs):
        if session is None:
            for name in ("max_redirects", "verify", "cert", "proxies"):
                kwargs.pop(name, None)
        return send(self, case, session=session, **kwargs)

    monkeypatch.setattr(WSGITransport, "send", send_in_process)


def run_schemathesis(key, phases):
    config = SchemathesisConfig.from_dict({
        "seed": SEED,
        "suppress-health-check": ["all"],  # slow generation is not a fault of the API
        "headers": {"Authorization": f"Bearer {key}"},
        "generation": {"max-examples": EXAMPLES, "deterministic": True, "database": "none"},
        # `all` checks include a response-time limit, 10 s unless set; a long poll on an empty
        # conversation answers when its `wait` ends (up to 30 s, as the schema says), so the
        # limit is that plus a margin. (A fuzzed wait of 12.9 s on an empty conversation
        # failed the default once the suite ran two tests at a time per pass.)
        # A valid request may also be 422: its Idempotency-Key was sent before with another
        # request (schemathesis's coverage phase repeats a header's value; the API answers 422
        # for nothing else).
        "checks": {"max_response_time": LONGEST_WAIT + 5.0, "positive_data_acceptance": {
            "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]}},
        # Real rows most of the time: the channel the key may use (and one it may not), the
        # message it may edit. Ids of turns, conversations and claims come from the API's
        # own answers (the stateful phase follows them).
        "dictionaries": {"slugs": {"values": [SLUG, "elsewhere"]}, "messages": {"values": [EDITED, "m1"]}},
        "parameters": {"path.slug": {"dictionary": "slugs", "probability": 0.8},
                       "path.message_id": {"dictionary": "messages", "probability": 0.5}},
    })
    project = config.projects.override
    project.checks.update(included_check_names=["all"])
    project.phases.update(phases=list(phases))
    schemathesis.openapi.format("cursor", cursors())
    # A client's Idempotency-Key is new to each request (a key reused with another body is
    # 422, as documented): a fresh UUID each time.
    schemathesis.openapi.format("idempotency-key", st.builds(lambda: str(uuid.uuid4())))
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", WSGIHandler(), config=config)
    # The SSE stream stays open until its reply or its deadline (1–300 s): in-process under
    # WSGI each generated case would hold for that long. Its schema and its answers are
    # tested against real servers instead (tests/end_to_end/test_api_stream.py).
    schema = schema.exclude(path_regex=r"/stream$")
    failures, errors, tested = [], [], set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            if event.status != Status.SKIP:
                tested.add(event.label or "stateful")  # a stateful scenario spans operations
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failures.append(f"{event.phase.value} {event.label}: {check.failure_info.failure.title}\n"
                                        f"  {check.failure_info.failure.message}\n  {check.failure_info.code_sample}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            errors.append(f"{getattr(event, 'label', '')} {event.info.format()}\n{event.info.traceback}")
    return failures, errors, tested


@pytest.mark.parametrize("phases", [("examples", "coverage"), ("fuzzing",), ("stateful",)], ids="+".join)
def test_every_operation_is_true_to_the_schema_with_all_checks(key, in_process_transport, settings, phases):
    # A claim identical to one in flight waits for it to settle (3 s by default): the same
    # answers, sooner.
    settings.AGENTLOOP_GUARD_WAIT = 0.1
    started = time.monotonic()
    failures, errors, tested = run_schemathesis(key, phases)
    assert not errors, "\n".join(errors)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(dict.fromkeys(failures))
    operations = {label for label in tested if " /api/v1/" in label}
    if phases == ("stateful",):
        # Its scenarios chain operations through the links the schema declares.
        assert tested == {"stateful"}, tested
    else:
        # Every operation of the schema but the SSE stream (left out above).
        assert len(operations) == 19, tested
        assert not [label for label in operations if label.endswith("/stream")]
    print(f"schemathesis {'+'.join(phases)}: {len(operations)} operations, 0 failures, "
          f"{time.monotonic() - started:.1f}s")
