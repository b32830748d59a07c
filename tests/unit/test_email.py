"""The email platform's parts: a mail read into our types (threads, quotes, signatures,
bounces, autoresponders, what cannot be read), the reply's SMTP outcomes against a real
SMTP server (aiosmtpd), the mailbox's cursor and login against a real Dovecot, and the
channel's settings."""

import asyncio

import pytest
from django.core.exceptions import ValidationError

from conversations.ingest import Inbound
from conversations.models import InboundMessage
from conversations.platforms import get
from conversations.platforms.email import parsing
from conversations.platforms.email.mailbox import MailboxRefused, MailboxSession, connect, cursor_of, resume_after
from conversations.platforms.email.transport import EmailTransport
from delivery.models import Outcome
from delivery.transports import Target
from tests.conftest import free_port
from tests.fakes import dovecot as imap
from tests.fakes.dovecot import mail
from tests.fakes.smtp_server import FakeSMTP

OWN = imap.USER


def parsed(message, uid=7, validity=99):
    return parsing.parse(OWN, parsing.Mail(validity, uid, bytes(message)))


# --- reading a mail -----------------------------------------------------------------------


def test_a_thread_is_one_chat_named_by_its_root_and_the_reply_headers_ride_along():
    [first] = parsed(mail("Ana <Ana@Client.test>", "Hola", subject="Reserva", message_id="<r1@c.test>"))
    assert isinstance(first, Inbound)
    assert (first.platform_message_id, first.chat_id, first.sender_id, first.sender_name) == (
        "r1@c.test", "r1@c.test", "ana@client.test", "Ana")
    assert first.text == "Reserva\n\nHola" and first.reply_target == "r1@c.test" and not first.is_group
    assert first.address == {"from": "ana@client.test", "subject": "Re: Reserva", "message_id": "r1@c.test",
                             "references": "<r1@c.test>"}
    [later] = parsed(mail("ana@client.test", "y mañana", subject="RE: Reserva", message_id="<r3@c.test>",
                          in_reply_to="<r2@c.test>", references="<r1@c.test> <r2@c.test>"))
    assert later.chat_id == "r1@c.test" and later.text == "y mañana"  # a reply: no subject line
    assert later.address["subject"] == "RE: Reserva" and later.address["references"] == \
        "<r1@c.test> <r2@c.test> <r3@c.test>"
    [replied] = parsed(mail("ana@client.test", "ok", message_id="<r4@c.test>", in_reply_to="<r2@c.test>"))
    assert replied.chat_id == "r2@c.test"  # no References: the mail it answers names the thread


def test_quoted_history_and_signatures_are_not_what_the_agent_reads():
    for text in ("Sí, a las 10\n\nOn Mon, 7 Dec 2026 at 10:00, Bot <bot@shop.test> wrote:\n> ¿A qué hora?\n",
                 "Sí, a las 10\n\nOn Mon, 7 Dec 2026 at 10:00, Bot <bot@\nshop.test> wrote:\n> ¿A qué hora?",
                 "Sí, a las 10\n\nEl lun, 7 dic 2026 a las 10:00, Bot escribió:\n> ¿A qué hora?",
                 "Sí, a las 10\n-- \nAna García\nTel. 600",
                 "> ¿A qué hora?\nSí, a las 10\n> otra línea citada",
                 "Sí, a las 10\n\n-----Original Message-----\nFrom: bot\n¿A qué hora?"):
        [message] = parsed(mail("ana@client.test", text, in_reply_to="<x@c.test>"))
        assert message.text == "Sí, a las 10", text


def test_html_only_mail_is_read_as_text_without_its_quoted_blockquote():
    message = mail("ana@client.test", "", in_reply_to="<x@c.test>")
    message.set_content("<html><head><style>p{}</style></head><body><p>Hola <b>equipo</b></p>"
                        "<blockquote>lo de antes</blockquote></body></html>", subtype="html")
    [inbound] = parsed(message)
    assert inbound.text == "Hola equipo"


def test_attachments_are_media_named_by_mailbox_mail_and_part():
    photo, pdf = (b"\xff\xd8\xff" + b"0" * 50), b"%PDF-1.4 x"
    items = parsed(mail("ana@client.test", "mira", message_id="<m1@c.test>",
                        attachments=(("a.jpg", "image/jpeg", photo), ("b.pdf", "application/pdf", pdf))),
                   uid=12, validity=5)
    assert [(item.platform_message_id, item.media.ref, item.media_type, item.media.file_name, item.text)
            for item in items] == [("m1@c.test", "5:12:0", "photo", "a.jpg", "Reserva\n\nmira"),
                                   ("m1@c.test#1", "5:12:1", "document", "b.pdf", "")]
    assert items[0].album_id == items[1].album_id == "m1@c.test" and items[0].media.declared_size == len(photo)


def test_ids_too_long_for_the_columns_are_digests_and_a_mail_without_one_is_named_by_its_content():
    long_id = "x" * 300 + "@c.test"
    [inbound] = parsed(mail("ana@client.test", "hola", message_id=f"<{long_id}>"))
    assert inbound.platform_message_id.startswith("sha256:") and len(inbound.chat_id) <= 100
    assert inbound.reply_target == ""
    raw = b"From: ana@client.test\r\nSubject: sin id\r\n\r\nhola\r\n"
    [one], [again] = parsing.parse(OWN, parsing.Mail(1, 1, raw)), parsing.parse(OWN, parsing.Mail(2, 9, raw))
    assert one.platform_message_id == again.platform_message_id  # re-fetched under a new UID: the same message


def test_autoresponders_are_bots_and_our_own_or_senderless_mail_is_nothing():
    [auto] = parsed(mail("ana@client.test", "Estoy de vacaciones", headers={"Auto-Submitted": "auto-replied"}))
    [listed] = parsed(mail("list@client.test", "boletín", headers={"Precedence": "bulk"}))
    assert auto.is_bot and listed.is_bot
    assert parsed(mail(OWN, "our own reply, copied back")) == []
    assert parsing.parse(OWN, parsing.Mail(1, 1, b"Subject: nadie\r\n\r\nhola\r\n")) == []
    assert parsed(mail("ana@client.test", "", subject="")) == []  # nothing to read


def test_a_bounce_names_the_reply_it_returns_and_a_delay_is_nothing():
    report = ("From: MAILER-DAEMON@c.test\r\nTo: bot@shop.test\r\nSubject: Undelivered\r\nMIME-Version: 1.0\r\n"
              'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n\r\n'
              "--B\r\nContent-Type: text/plain\r\n\r\nfailed\r\n"
              "--B\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx.c.test\r\n\r\n"
              "Final-Recipient: rfc822; ana@client.test\r\nAction: {action}\r\nStatus: {status}\r\n"
              "Diagnostic-Code: smtp; 550 5.1.1 unknown\r\n\r\n"
              "--B\r\nContent-Type: message/rfc822\r\n\r\nMessage-ID: <ours@shop.test>\r\nSubject: Re: x\r\n\r\nhola\r\n"
              "--B--\r\n")
    [bounce] = parsing.parse(OWN, parsing.Mail(1, 1, report.format(action="failed", status="5.1.1").encode()))
    assert bounce == parsing.Bounce("ours@shop.test", "ana@client.test",
                                    "bounced: 5.1.1 smtp; 550 5.1.1 unknown", permanent=True)
    [later] = parsing.parse(OWN, parsing.Mail(1, 1, report.format(action="failed", status="4.4.7").encode()))
    assert not later.permanent
    assert parsing.parse(OWN, parsing.Mail(1, 1, report.format(action="delayed", status="4.4.1").encode())) == []


def test_a_mail_no_parser_can_read_is_skipped(make_channel):
    channel = make_channel("mail", kind="email", platform_settings={"address": OWN})
    connection = get("email").connection()
    assert connection.parse(channel, parsing.Mail(1, 3, b"\xff\xfe\x00garbage")) is None
    assert connection.parse(channel, {"not": "a mail"}) is None
    assert not InboundMessage.objects.exists()


# --- the cursor -----------------------------------------------------------------------------


def test_the_cursor_holds_uidvalidity_and_uid_and_a_new_uidvalidity_starts_over():
    cursor = cursor_of(4_000_000_000, 41)
    assert cursor < 2**63 and resume_after(cursor, 4_000_000_000) == 41
    assert resume_after(cursor, 4_000_000_001) == 0 and resume_after(None, 7) == 0


@pytest.fixture
def dovecot():
    server = imap.shared()
    server.empty()
    yield server
    server.empty()


def mailbox_channel(make_channel, server, password=imap.PASSWORD, smtp=None):
    settings = {"address": OWN, "username": OWN, "password": password, "imap_host": "127.0.0.1",
                "imap_port": server.port, "imap_security": "none", "smtp_host": "127.0.0.1",
                "smtp_port": smtp.port if smtp else 25, "smtp_security": "none", "busy_wait": 2}
    return make_channel("mail", kind="email", platform_settings=settings)


def test_a_wrong_password_is_refused_loudly(make_channel):
    server = imap.Dovecot().start()  # its own: Dovecot delays the next logins from an address that failed one
    try:
        channel = mailbox_channel(make_channel, server, password="wrong")
        with pytest.raises(MailboxRefused, match="refused the login"):
            connect(channel)
    finally:
        server.close()


def test_a_session_hands_over_what_came_after_the_cursor_in_order(make_channel, dovecot):
    channel = mailbox_channel(make_channel, dovecot)
    dovecot.deliver(*(mail("ana@client.test", f"m{n}", message_id=f"<s{n}@c.test>") for n in range(3)))
    got = []

    async def receive(payloads, cursor):
        got.append(([parsing.read(one.raw)["Message-ID"] for one in payloads], cursor))
        return len(payloads)

    async def first_then_resume():
        session = asyncio.create_task(MailboxSession(channel, None, receive).run())
        while not got:
            await asyncio.sleep(0.02)
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)
        dovecot.deliver(mail("ana@client.test", "m3", message_id="<s3@c.test>"))
        resumed = asyncio.create_task(MailboxSession(channel, got[0][1], receive).run())
        while len(got) < 2:
            await asyncio.sleep(0.02)
        resumed.cancel()
        await asyncio.gather(resumed, return_exceptions=True)

    asyncio.run(asyncio.wait_for(first_then_resume(), 20))
    assert [ids for ids, _ in got] == [["<s0@c.test>", "<s1@c.test>", "<s2@c.test>"], ["<s3@c.test>"]]
    assert got[1][1] & 0xFFFFFFFF == (got[0][1] & 0xFFFFFFFF) + 1


# --- replies over SMTP ----------------------------------------------------------------------


@pytest.fixture
def smtp(transactional_db):
    """The SMTP server; the database committed (the transport reads a conversation from a thread)."""
    with FakeSMTP() as server:
        yield server


def reply(channel, make_conversation, text="hola", **target):
    conversation = make_conversation(channel, contact="ana@client.test")
    return asyncio.run(EmailTransport(channel).send_text(
        Target(conversation.chat_id, conversation_id=conversation.pk, **target), text))


def test_a_reply_goes_to_the_conversations_sender_threaded(make_channel, make_conversation, smtp):
    channel = mailbox_channel(make_channel, imap.shared(), smtp=smtp)
    result = reply(channel, make_conversation, "♻️ label\n\nhola", reply_target="r9@c.test")
    assert result.ok and result.platform_message_id.endswith("@shop.test")
    [sent] = smtp.received
    assert sent.recipients == ["ana@client.test"] and sent.sender == OWN
    assert sent.message["In-Reply-To"] == "<r9@c.test>" and sent.message["References"] == "<r9@c.test>"
    assert sent.message["Message-ID"] == f"<{result.platform_message_id}>"
    assert sent.body.splitlines()[0] == "♻️ label"  # the body is the ledger's text, from its first line


@pytest.mark.parametrize(("command", "answer", "outcome", "unreachable"), [
    ("MAIL", "421 4.7.0 Try again later", Outcome.FLOOD, True),
    ("RCPT", "451 4.7.1 Greylisted", Outcome.FLOOD, True),
    ("RCPT", "452 4.2.2 Mailbox full", Outcome.TEMPORARY, True),
    ("RCPT", "550 5.1.1 No such user", Outcome.PERMANENT, True),
    ("MAIL", "553 5.7.1 Sender not allowed", Outcome.CHANNEL_BLOCKED, True),
    ("DATA", "552 5.3.4 Message too big", Outcome.PERMANENT, False),
    ("DATA", "554 5.7.1 Spam", Outcome.PERMANENT, False),
])
def test_each_smtp_answer_maps_to_its_outcome(make_channel, make_conversation, smtp, command, answer, outcome,
                                              unreachable):
    channel = mailbox_channel(make_channel, imap.shared(), smtp=smtp)
    smtp.answers[command] = answer
    result = reply(channel, make_conversation)
    assert (result.outcome, result.chat_unreachable) == (outcome, unreachable)
    assert answer.split()[0] in result.error and not smtp.received
    if outcome == Outcome.FLOOD:
        assert result.retry_after == 2.0  # the channel's busy_wait


def test_a_connection_lost_after_data_is_ambiguous_and_before_it_not_sent(make_channel, make_conversation, smtp):
    channel = mailbox_channel(make_channel, imap.shared(), smtp=smtp)
    conversation = make_conversation(channel, contact="ana@client.test")
    target = Target(conversation.chat_id, conversation_id=conversation.pk)
    smtp.drop_in_data = True
    assert asyncio.run(EmailTransport(channel).send_text(target, "hola")).outcome == Outcome.AMBIGUOUS
    channel.platform_settings = {**channel.platform_settings, "smtp_port": free_port()}  # nothing listens there
    assert asyncio.run(EmailTransport(channel).send_text(target, "hola")).outcome == Outcome.NOT_SENT
    nobody = asyncio.run(EmailTransport(channel).send_text(Target("x@c.test"), "hola"))
    assert nobody.outcome == Outcome.PERMANENT and "no address" in nobody.error  # no conversation, no address


# --- settings -------------------------------------------------------------------------------


def test_settings_are_checked_and_the_password_is_secret(make_channel):
    channel = make_channel("mail", kind="email", platform_settings={"address": OWN, "imap_port": "143"})
    assert channel.platform_settings["imap_port"] == 143 and channel.platform_settings["smtp_port"] == 587
    assert channel.send_blocked  # no password, no SMTP host
    with pytest.raises(ValidationError):
        make_channel("bad", kind="email", platform_settings={"address": "not an address"})
    with pytest.raises(ValidationError):
        make_channel("bad2", kind="email", platform_settings={"address": OWN, "smtp_port": 70000})
    assert get("email").settings["password"].secret
