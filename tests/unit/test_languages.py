"""Every text agentloop writes to a user, in their language: the contact's (Telegram's
`language_code`, stored when the contact arrives), else the channel's, else the
deployment's. Through the real admission, the real ledger rows and their send-time
marker, on the test database."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.utils import translation

from agentloop.core import languages
from conversations import control, flushing, ingest
from conversations.ingest import Inbound, admit
from conversations.models import Contact, Conversation, DoubleTexting, Turn, TurnState
from conversations.worker import APOLOGY
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage
from tools import confirmations, questions

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
LANGUAGES = ("es", "en", "pt")

# What each user reads, per text and language (the catalogs in locale/).
EXPECTED = {
    "apology": {
        "en": "Sorry — I couldn't finish that just now. Please try again in a moment.",
        "es": "Lo siento — no he podido terminar eso ahora. Inténtalo de nuevo en un momento.",
        "pt": "Desculpe — não consegui terminar isso agora. Tente de novo daqui a pouco.",
    },
    "marker": {
        "en": "♻️ Recovered reply — this may repeat a message you already received.\n\n",
        "es": "♻️ Respuesta recuperada — puede repetir un mensaje que ya recibiste.\n\n",
        "pt": "♻️ Resposta recuperada — pode repetir uma mensagem que você já recebeu.\n\n",
    },
    "reject": {
        "en": "I'm still working on your previous message. Please send this again once I've answered.",
        "es": "Todavía estoy trabajando en tu mensaje anterior. Envía este de nuevo cuando haya contestado.",
        "pt": "Ainda estou trabalhando na sua mensagem anterior. Envie esta de novo quando eu tiver respondido.",
    },
    "overflow": {
        "en": "You've sent more than I can keep up with. I'll answer what I have so far; "
              "please send the rest again once I've replied.",
        "es": "Has enviado más de lo que puedo seguir. Responderé a lo que tengo hasta ahora; "
              "envía el resto de nuevo cuando haya contestado.",
        "pt": "Você enviou mais do que consigo acompanhar. Vou responder ao que tenho até agora; "
              "envie o resto de novo quando eu tiver respondido.",
    },
    "/stop": {"en": "Nothing to stop.", "es": "No hay nada que detener.", "pt": "Não há nada para parar."},
    "/reset": {
        "en": "Conversation reset. What can I do for you?",
        "es": "Conversación reiniciada. ¿En qué puedo ayudarte?",
        "pt": "Conversa reiniciada. Em que posso ajudar?",
    },
    "/help": {"en": "/reset — start a fresh conversation", "es": "/reset — empezar una conversación nueva",
              "pt": "/reset — começar uma conversa nova"},
    "/start": {"en": "Hi! Send me your message", "es": "¡Hola! Envíame tu mensaje", "pt": "Olá! Envie sua mensagem"},
    "buttons": {"en": ("✅ Yes, do it", "❌ No"), "es": ("✅ Sí, hazlo", "❌ No"), "pt": ("✅ Sim, pode fazer", "❌ Não")},
    "question": {
        "en": "Please confirm: send the email “Hola” to ana@example.com.\nReply yes or no.",
        "es": "Confirma, por favor: enviar el correo “Hola” a ana@example.com.\nResponde sí o no.",
        "pt": "Confirme, por favor: enviar o e-mail “Hola” para ana@example.com.\nResponda sim ou não.",
    },
    "declined": {"en": "Already declined at 10:00.", "es": "Ya se rechazó a las 10:00.",
                 "pt": "Já foi recusado às 10:00."},
}


def msg(mid, text, language="", sender="100"):
    return Inbound(platform_message_id=str(mid), chat_id=sender, sender_id=sender, text=text,
                   reply_target=str(mid), language=language)


def notices(conversation_id=None):
    rows = OutboundMessage.objects.order_by("pk")
    return list(rows.filter(conversation_id=conversation_id) if conversation_id else rows)


def test_the_platform_code_is_narrowed_to_a_catalog_and_unknown_ones_fall_through(settings):
    assert languages.choose("pt-BR") == "pt" and languages.choose("es_MX") == "es"
    assert languages.choose("fr", "es") == "es"  # no French catalog: the channel's
    assert languages.choose("", "") == "en"
    settings.LANGUAGE_CODE = "pt"
    assert languages.choose("fr", "") == "pt"  # the deployment's


def test_the_contact_language_is_stored_when_it_arrives(make_channel):
    channel = make_channel("chan")
    admit(channel, msg(1, "hola", language="es-419"), now=T0)
    assert Contact.objects.get().language == "es-419"
    assert Conversation.objects.get().language == "es-419"


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_apology(language):
    assert languages.text_in(language, APOLOGY) == EXPECTED["apology"][language]


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_marker_is_the_rows_language_and_its_sign_comes_first(make_channel, language):
    channel = make_channel("chan", double_texting=DoubleTexting.REJECT)
    admit(channel, msg(1, "/stop", language=language), now=T0)
    [row] = notices()
    assert row.language == language
    row.needs_marker = True
    sent = ledger.text_to_send(row)
    assert sent == EXPECTED["marker"][language] + EXPECTED["/stop"][language]
    assert sent.startswith(ledger.RECOVERY_SIGN)


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_reject_notice(make_channel, language):
    channel = make_channel("chan", double_texting=DoubleTexting.REJECT)
    admit(channel, msg(1, "hola", language=language), now=T0)
    [turn] = flushing.flush_due(now=T0 + timedelta(seconds=30))
    Turn.objects.filter(pk=turn.pk).update(state=TurnState.RUNNING, owner="worker:w")
    admit(channel, msg(2, "¿y?", language=language), now=T0 + timedelta(seconds=31))
    [row] = notices()
    assert row.kind == OutboundKind.NOTICE and row.text == EXPECTED["reject"][language]


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_overflow_notice(make_channel, settings, language):
    settings.AGENTLOOP_MAX_PENDING_MESSAGES = 2
    channel = make_channel("pulled", agent="pull", max_messages=10)
    admit(channel, msg("first", "hola", language=language), now=T0)
    flushing.flush_due(now=T0 + timedelta(seconds=5))  # a turn nobody claims
    for i in range(4):
        admit(channel, msg(i, f"mensaje {i}", language=language), now=T0 + timedelta(seconds=6 + i))
    [row] = notices()
    assert row.text == EXPECTED["overflow"][language] == languages.text_in(language, ingest.OVERFLOW_NOTICE)


@pytest.mark.parametrize("command", ["/stop", "/reset", "/help", "/start"])
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_command_answers(make_channel, language, command):
    admit(make_channel("chan"), msg(1, command, language=language), now=T0)
    [row] = notices()
    assert row.kind == OutboundKind.CONTROL and EXPECTED[command][language] in row.text


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_channel_language_is_for_users_whose_platform_gives_none(make_channel, language):
    channel = make_channel("chan", language=language)
    admit(channel, msg(1, "/stop"), now=T0)  # no language_code
    admit(channel, msg(2, "/stop", language="es", sender="200"), now=T0)  # the contact's wins
    assert [row.text for row in notices()] == [EXPECTED["/stop"][language], EXPECTED["/stop"]["es"]]


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_confirmation_buttons_question_and_outcomes(make_channel, make_conversation, language):
    conversation = make_conversation(make_channel("chan", kind="api"), "ana")
    Conversation.objects.filter(pk=conversation.pk).update(language=language)
    conversation.refresh_from_db()
    confirmation = SimpleNamespace(token="t" * 24, conversation=conversation, text="¿?")
    assert [label for label, _ in confirmations.buttons(confirmation)] == list(EXPECTED["buttons"][language])
    claim = SimpleNamespace(action="email_send", arguments={"subject": "Hola", "to": "ana@example.com"})
    with translation.override(language):
        assert questions.question_text(claim, conversation.channel) == EXPECTED["question"][language]
    proposal = SimpleNamespace(state="rejected", decided_at=T0, expires_at=T0)
    assert questions.reply_to_tap(confirmation, proposal, False).toast == EXPECTED["declined"][language]


def test_a_row_keeps_the_language_it_was_written_in(make_channel, make_conversation):
    """The marker is decided at send time: it speaks the row's language, not whatever
    the conversation's is by then."""
    conversation = make_conversation(make_channel("chan", language="es"), "ana")
    row = ledger.enqueue(conversation, control.NOTHING_TO_STOP, kind=OutboundKind.CONTROL)
    conversation.channel.language = "pt"
    conversation.channel.save()
    row.refresh_from_db()
    row.needs_marker = True
    assert row.text == "No hay nada que detener."
    assert ledger.text_to_send(row).startswith(EXPECTED["marker"]["es"])


def test_every_marker_leaves_room_in_every_chunk():
    assert ledger.prefix_units() >= max(len(m.encode("utf-16-le")) // 2 for m in EXPECTED["marker"].values())


@pytest.mark.parametrize(("accept", "heading", "crumb"), [
    ("es-ES,es;q=0.9", "Turnos en curso", "Panel en vivo"),
    ("pt-BR,pt;q=0.9", "Turnos em andamento", "Painel ao vivo"),
    ("en-US,en;q=0.9", "Turns in flight", "Live dashboard"),
])
def test_the_console_and_the_admin_follow_the_browser_language(admin_client, accept, heading, crumb):
    page = admin_client.get("/console/", HTTP_ACCEPT_LANGUAGE=accept).content.decode()
    assert heading in page and crumb in page
    admin = admin_client.get("/admin/conversations/channel/add/", HTTP_ACCEPT_LANGUAGE=accept)
    assert f'lang="{accept[:2]}"' in admin.content.decode()


def test_a_contact_who_changes_language_is_answered_in_the_new_one(make_channel):
    channel = make_channel("chan")
    admit(channel, msg(1, "/stop", language="en"), now=T0)
    admit(channel, msg(2, "/stop", language="pt-BR"), now=T0 + timedelta(seconds=1))
    admit(channel, msg(3, "/stop"), now=T0 + timedelta(seconds=2))  # none given: the last one stands
    assert Contact.objects.get().language == "pt-BR"
    assert [row.text for row in notices()] == [EXPECTED["/stop"]["en"], *[EXPECTED["/stop"]["pt"]] * 2]


def test_the_api_takes_the_senders_language(make_channel, agent_key, client):
    channel = make_channel("shop", kind="api")
    key = agent_key(channel)
    response = client.post("/api/v1/channels/shop/messages", {"message_id": "m1", "contact": "ana", "text": "/stop",
                                                               "language": "es"},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 202, response.content
    assert Contact.objects.get().language == "es"
    assert [row.text for row in notices()] == [EXPECTED["/stop"]["es"]]


LIMIT_TEXTS = {
    "en": "You've reached the limit of messages I can answer for now.",
    "es": "Has alcanzado el límite de mensajes que puedo responder por ahora.",
    "pt": "Você atingiu o limite de mensagens que posso responder por agora.",
}


@pytest.mark.parametrize("language", sorted(LIMIT_TEXTS))
def test_the_limit_notice(language):
    from conversations.limits import LIMIT_NOTICE

    assert languages.text_in(language, LIMIT_NOTICE).startswith(LIMIT_TEXTS[language])
