"""The peer bench's spike figures (issue 57): what a person waited, from their POST's 200
to their reply at the Bot API, read from the load client's answer times and the fake's
calls (tests/bench/peer.py `waits`)."""

from types import SimpleNamespace

from tests.bench import peer


class Calls:
    """The fake Bot API's `calls(method, token=)`, over given calls."""

    def __init__(self, *calls):
        self._calls = [SimpleNamespace(method="sendMessage", token="t", params={"chat_id": chat}, at=at)
                       for chat, at in calls]

    def calls(self, method, token=None):
        return [call for call in self._calls if call.method == method and call.token == token]


def chat(client, k, offset=0):
    """The chat of client `client`'s k-th message, as loadgen numbers them."""
    return 1_000_000 + offset + client + k * peer.CONCURRENCY


def test_each_accepted_message_is_timed_from_its_200_to_its_first_reply():
    # Client 0 sent two messages (answered 200 at 10.0 and 11.0), client 1 one that was refused.
    run = {"ended": 12.0, "accepted_at": [[10.0, 11.0], [10.5]] + [[]] * (peer.CONCURRENCY - 2)}
    run["accepted_at"][1] = [None]
    fake = Calls((chat(0, 0), 10.5), (chat(0, 0), 13.0),  # a second copy: the first reply counts
                 (chat(0, 1), 17.5),  # 6.5 s after its 200, 5.5 s after the load stopped
                 (chat(1, 0), 11.0))  # the refused message's chat: not an accepted message's reply
    waits = peer.waits(run, fake, "t", offset=0)
    assert waits["accepted"] == waits["answered"] == 2
    assert waits["at_end"] == waits["later"] == waits["within"] == 0.5
    assert waits["p50"] == 0.5 and waits["max"] == 6.5


def test_a_message_never_answered_counts_against_every_share():
    run = {"ended": 5.0, "accepted_at": [[1.0, 2.0]] + [[]] * (peer.CONCURRENCY - 1)}
    waits = peer.waits(run, Calls((chat(0, 0), 1.2)), "t", offset=0)
    assert waits["accepted"] == 2 and waits["answered"] == 1
    assert waits["at_end"] == waits["later"] == waits["within"] == 0.5
    assert waits["max"] == waits["p99"] == 1.2 - 1.0
