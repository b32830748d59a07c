"""What each platform's transport can do besides text is detected from what it gives
(delivery.transports.Transport.capabilities: the methods it overrides, the flags it sets),
never declared apart from the code: a platform cannot claim previews it does not send."""

from conversations.models import Channel
from delivery.transports import Capability, Transport, carriers, transport_for
from tests.echo_platform.transport import EchoTransport

C = Capability
EXPECTED = {
    "api": {C.PREVIEWS},  # the API's stream of a reply being written
    "sandbox": set(),  # a replay's channel (agentloop.console.replay): it records text, nothing else
    "webchat": {C.FILES, C.TYPING, C.PREVIEWS},
    "telegram": {C.FILES, C.TYPING, C.REACTIONS, C.PREVIEWS, C.EDIT, C.DELETE},
    "whatsapp": {C.FILES, C.TEMPLATES, C.TYPING, C.REACTIONS},
    "slack": {C.FILES, C.TYPING, C.REACTIONS, C.PREVIEWS, C.EDIT, C.DELETE},
    "discord": {C.FILES, C.TYPING, C.REACTIONS, C.PREVIEWS, C.EDIT, C.DELETE},
    "matrix": {C.TYPING, C.REACTIONS, C.PREVIEWS, C.EDIT, C.DELETE},
    "google_chat": {C.PREVIEWS, C.EDIT, C.DELETE},  # Chat has no typing; uploads need user auth
    "teams": {C.FILES, C.TYPING, C.PREVIEWS, C.EDIT, C.DELETE},  # files: consent cards in personal chats
    # Meta's Send API: no edits or deletes of a sent message; typing_on and mark_seen.
    "messenger": {C.FILES, C.TYPING},
    "instagram": {C.FILES, C.TYPING},  # files by link (public_url), else named under the text
    "sms": {C.FILES},  # MMS (signed links Twilio fetches); SMS has no typing, edits or reactions
    "email": {C.FILES},  # files: attachments of a mail of their own
}


def test_each_platform_can_do_what_its_transport_implements():
    found = {kind: set(type(transport_for(Channel(kind=kind))).capabilities()) for kind in carriers()}
    assert found == EXPECTED


def test_a_transport_that_only_sends_text_has_no_capability_and_a_flag_without_its_method_is_none():
    assert EchoTransport.capabilities() == frozenset()

    class Flagged(EchoTransport):
        supports_typing = True  # no send_typing: no typing
        status_reactions = ("👀", "✅")  # no set_reaction: no reactions

    assert Flagged.capabilities() == frozenset()

    class Typing(Flagged):
        async def send_typing(self, target):
            return None

    assert Typing.capabilities() == {C.TYPING}
    assert Transport.capabilities() == frozenset()
