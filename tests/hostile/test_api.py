"""Hostile input at the REST API and from the services agentloop calls on an agent's
behalf (docs/security.md): what an agent key, or an agent's own service, can send
back, and what holds.

- A webhook agent's streamed answer (issue 51, finding 11a) is capped in bytes as they
  arrive, not line by line: a stream that never ends its line is cut at
  AGENTLOOP_AGENT_MAX_ANSWER_BYTES and the turn fails saying so, not held in the
  worker's memory until the agent's timeout. Through the real web server, worker and
  fake Bot API, against a local HTTP service."""

import pytest

from conversations.models import Turn, TurnState
from tests.end_to_end.test_untrusted_answers import answering  # noqa: F401 (a fixture: local agent services)
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
CAP = 1_000_000


def test_a_streamed_answer_that_never_ends_its_line_is_cut_at_the_cap(processes, make_channel, fake_telegram,
                                                                       answering):  # noqa: F811
    # 3 MB of one delta that never ends, then the connection held open past the agent's timeout.
    agent = answering(body=b'{"delta": "' + b"a" * 3_000_000, content_type="application/x-ndjson", hold=40)
    telegram_channel(make_channel, fake_telegram, agent="webhook", extra=UNPACED,
                     agent_config={"url": agent.url, "timeout": 30})
    web, _ = processes.web(wait=False), processes.worker(AGENTLOOP_AGENT_MAX_ANSWER_BYTES=CAP)
    send(web, "tg", 101, "Cuéntame.")
    [apology] = fake_telegram.wait_for("sendMessage", timeout=40)
    turn = Turn.objects.get()
    host = agent.url.split("/")[2]
    assert (turn.state, turn.outcome) == (TurnState.FAILED, f"agent unavailable: the agent at {host} answered more "
                                          f"than {CAP} bytes (AGENTLOOP_AGENT_MAX_ANSWER_BYTES): not read further")
    assert agent.hung_up.wait(10)  # the worker dropped the connection at the cap
    assert apology.params["text"] and not fake_telegram.calls("sendMessageDraft")  # no line, no preview
