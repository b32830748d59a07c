"""How a person who acts in a conversation is named to an operator.

A person's reply is stored as a turn owned by "person:<who>" (conversations.handoff), and
<who> is how the console names its user: "console:<username>". Operators read the
username, the name they know their colleague by, never the plumbing around it. Here, at
the bottom, so the ledger's pages (delivery) and the console can both say it."""

PERSON_OWNER = "person:"
CONSOLE_USER = "console:"


def person_of(owner: str) -> str:
    """The person's name for a turn's owner, or "" when an agent (a worker) made the turn."""
    return display_name(owner[len(PERSON_OWNER):]) if (owner or "").startswith(PERSON_OWNER) else ""


def display_name(who: str) -> str:
    """"console:olga" -> "olga"; anyone else (the loop breaker, an API client) as written."""
    who = who or ""
    return who[len(CONSOLE_USER):] if who.startswith(CONSOLE_USER) else who
