"""Calls that would point up the layer order (.importlinter), filled in by `ready()`:

- from conversations, the app above tools (its `AppConfig.ready()`): `inform` — a
  decision on a proposal reaches its conversation (a note for the agent, optionally a
  message to the user: conversations.notes); `conversation_for_key` — the conversation
  an agent key names in an API request, if it is in one of the key's channels
  (conversations.api); `take_over` — the `handoff` tool hands the conversation to a
  person (conversations.handoff); `hand_to_agent` — the `handoff_to_agent` tool pins
  the conversation to another agent (conversations.routing);
- inside tools, whose modules stand confirmations → approvals → guard (tools'
  `AppConfig.ready()`): the guard opens, expires and sweeps proposals (tools.approvals,
  which runs an approved proposal through the guard); approvals asks the user in the
  chat and withdraws the question (tools.confirmations, which answers through approvals).

Conversations' models are reached by name (`model("Conversation")`), as foreign keys do.
"""

from django.apps import apps

_providers: dict = {}


def register(**providers):
    """`conversations=`, `approvals=`, `confirmations=`: each an object (a module) with
    the functions this module calls on it."""
    _providers.update(providers)


def _of(name):
    try:
        return _providers[name]
    except KeyError:
        raise RuntimeError(f"tools.hooks: no {name} registered (its app is not ready)") from None


def model(name):
    """One of conversations' models (Conversation, Turn…)."""
    return apps.get_model("conversations", name)


# --- conversations ------------------------------------------------------------------------


def inform(conversation_id, *, for_agent: str, for_user: str = "") -> bool:
    return _of("conversations").inform(conversation_id, for_agent=for_agent, for_user=for_user)


def conversation_for_key(key, conversation_id):
    return _of("conversations").conversation_for_key(key, conversation_id)


def take_over(conversation_id, *, by: str, reason: str = "") -> bool:
    return _of("conversations").take_over(conversation_id, by=by, reason=reason)


def hand_to_agent(conversation_id, agent: str, reason: str = "") -> tuple[bool, str]:
    """(moved, "") or (False, why not): conversations.routing.hand_over_for_tool."""
    return _of("conversations").hand_to_agent(conversation_id, agent, reason)


# --- approvals (for the guard) -----------------------------------------------------------------


def open_proposal(claim, policy):
    return _of("approvals").open_proposal(claim, policy)


def expire(proposal) -> bool:
    return _of("approvals").expire(proposal)


def reopen_interrupted() -> int:
    return _of("approvals").reopen_interrupted()


def expire_due(now) -> int:
    return _of("approvals").expire_due(now)


def settle_applying():
    return _of("approvals").settle_applying()


# --- confirmations (for approvals) ---------------------------------------------------------------


def ask(proposal, claim):
    return _of("confirmations").ask(proposal, claim)


def withdraw_question(proposal_id):
    return _of("confirmations").withdraw_question(proposal_id)
