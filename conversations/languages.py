"""The language a conversation's texts are written in (agentloop.core.languages): the
contact's platform language, else the channel's, else the deployment's."""

from agentloop.core import languages


def of(conversation) -> str:
    """No query: the contact's language is on the conversation, its channel is loaded with it."""
    return languages.for_conversation(conversation)


def text_for(conversation, text) -> str:
    """A gettext_lazy text (or a callable building one) in the conversation's language."""
    return languages.text_in(of(conversation), text)
