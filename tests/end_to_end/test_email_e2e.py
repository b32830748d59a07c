"""Email end to end, against real mail servers: Dovecot (IMAP, started once per test
session: tests/fakes/dovecot.py) holding the channel's mailbox, aiosmtpd receiving the
replies (tests/fakes/smtp_server.py), the real worker holding the mailbox open (IMAP
IDLE) and replying over SMTP. Mail arrives by IMAP APPEND, as a delivery would.

A storm of the same mail is one message; a burst in a thread (quoted history and a
signature below the new words) is one reply, threaded (`In-Reply-To`, `References`,
"Re: subject") after the 421 before it was waited out, unlabelled; Dovecot restarted
mid-burst: every mail of the burst answered once; a recipient the SMTP server refuses
(550) is tried once and the chat marked unreachable; a bounce (DSN) of a delivered reply
turns it unreachable; a mail's attachment is fetched from the mailbox, a reply's file
attached; a new UIDVALIDITY reads the mailbox again and nothing is answered twice; a
worker killed mid-send resends once, the ♻️ label the body's first line; a confirmation
answered "sí" three times (one mail delivered twice, and another) is applied once.
Channels are made in the database (the addchannel flags: tests/unit/test_email.py).
(No web server: email reaches us through the worker's IMAP session alone. Email has no
groups: no mention gating.)"""

from email import message_from_bytes, policy

import pytest

from conversations.models import Channel, InboundMessage, MediaFile, MediaState, Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import dovecot as imap
from tests.fakes.dovecot import mail
from tests.fakes.smtp_server import FakeSMTP

pytestmark = pytest.mark.e2e

ANA, LUIS, LUCIA, NOBODY = "ana@client.test", "luis@client.test", "lucia@client.test", "nobody@client.test"


@pytest.fixture
def dovecot():
    server = imap.shared()
    server.empty()
    yield server
    server.empty()


@pytest.fixture
def smtp():
    with FakeSMTP() as server:
        yield server


def add_channel(make_channel, server, smtp, agent="echo", window=1.0):
    settings = {"address": imap.USER, "username": imap.USER, "password": imap.PASSWORD, "imap_host": "127.0.0.1",
                "imap_port": server.port, "imap_security": "none", "smtp_host": "127.0.0.1", "smtp_port": smtp.port,
                "smtp_security": "none", "busy_wait": 1.5, "chat_interval": 0}
    return make_channel("mail1", kind="email", agent=agent, platform_settings=settings,
                        **{f"window_{kind}": window for kind in ("closed", "greeting", "open", "neutral")})


def body(received):
    return received.message.get_body(preferencelist=("plain",)).get_content().strip()


def to(smtp, address):
    return [one for one in smtp.received if one.recipients == [address]]


def admitted(count):
    return lambda: InboundMessage.objects.count() >= count


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def dsn(returned_id, recipient):
    """A delivery status notification as a mail server sends it (RFC 3464)."""
    return (f"From: Mail Delivery System <MAILER-DAEMON@client.test>\r\nTo: {imap.USER}\r\n"
            f"Subject: Undelivered Mail Returned to Sender\r\nMessage-ID: <dsn-{returned_id}>\r\n"
            "MIME-Version: 1.0\r\nAuto-Submitted: auto-replied\r\n"
            'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n\r\n'
            "--B\r\nContent-Type: text/plain\r\n\r\nThe mail could not be delivered.\r\n"
            "--B\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx.client.test\r\n\r\n"
            f"Final-Recipient: rfc822; {recipient}\r\nAction: failed\r\nStatus: 5.1.1\r\n"
            "Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n\r\n"
            f"--B\r\nContent-Type: text/rfc822-headers\r\n\r\nMessage-ID: <{returned_id}>\r\nTo: {recipient}\r\n\r\n"
            "--B--\r\n").encode()


def test_storms_bursts_floods_a_restart_of_dovecot_refusals_bounces_and_files(processes, make_channel, dovecot, smtp,
                                                                              tmp_path):
    from tests.support.agents_for_tests import jpeg

    # A window longer than the mailbox's recheck (RECHECK_EVERY, 2 s): a mail that lands as
    # IDLE begins is seen at the next recheck, so the burst's two deliveries can be seen that
    # far apart (once, at 2.0 s, under load: Ana's burst answered in two replies).
    add_channel(make_channel, dovecot, smtp, agent="echofile", window=4.0)
    processes.worker(AGENTLOOP_EXTRA_AGENTS="echofile=tests.support.agents_for_tests.EchoFileAgent",
                     AGENTLOOP_MEDIA_ROOT=str(tmp_path / "files"))
    # A storm: the same mail three times (as a client's resend, a re-fetch after a reconnect).
    # A burst in one thread: the root, then two replies quoting it, one signed.
    smtp.busy_next = 1  # the first send answered 421: waited out, resent unlabelled
    root = mail(ANA, "Hola, quiero reservar una mesa", subject="Reserva", message_id="<a1@client.test>")
    dovecot.deliver(root, root, root)
    dovecot.deliver(mail(ANA, "para dos personas\n\nOn Mon, 7 Dec 2026 at 10:00, Ana <ana@client.test> wrote:\n"
                              "> Hola, quiero reservar una mesa\n", subject="Re: Reserva",
                         message_id="<a2@client.test>", in_reply_to="<a1@client.test>",
                         references="<a1@client.test>"),
                    mail(ANA, "mañana a las 9\n> quoted line\n-- \nAna García\nTel. 600 000 000",
                         subject="Re: Reserva", message_id="<a3@client.test>", in_reply_to="<a2@client.test>",
                         references="<a1@client.test> <a2@client.test>"))
    # Another thread, with Dovecot restarted mid-burst: every mail admitted and answered once
    # (in one reply or two: the restart and the reconnection may outlast the burst's window).
    dovecot.deliver(mail(LUIS, "buenas", subject="Consulta", message_id="<b1@client.test>"))
    wait_until(lambda: InboundMessage.objects.filter(platform_message_id="b1@client.test").exists(), timeout=20,
               message="the first mail of the second burst admitted")
    dovecot.restart()
    dovecot.deliver(mail(LUIS, "¿abren el domingo?", subject="Re: Consulta", message_id="<b2@client.test>",
                         in_reply_to="<b1@client.test>", references="<b1@client.test>"))
    # A recipient the SMTP server refuses (550): tried once, the chat unreachable.
    smtp.refuse.add(NOBODY)
    dovecot.deliver(mail(NOBODY, "hola?", subject="?", message_id="<c1@client.test>"))

    # A photo in, a file out (the echofile agent answers "the file" with one: notes.txt).
    dovecot.deliver(mail(LUCIA, "mira esta foto y mándame the file", subject="Foto", message_id="<f1@client.test>",
                         attachments=(("foto.jpg", "image/jpeg", jpeg(3)),)))

    wait_until(lambda: to(smtp, ANA) and len(to(smtp, LUCIA)) == 2 and UnreachableChat.objects.exists()
               and "¿abren el domingo?" in " ".join(body(one) for one in to(smtp, LUIS)), timeout=40,
               message="every thread answered (a file as a mail of its own), one chat unreachable")
    [first], luis = to(smtp, ANA), to(smtp, LUIS)
    said = body(first)
    assert all(words in said for words in ("Hola, quiero reservar una mesa", "para dos personas", "mañana a las 9"))
    assert "wrote:" not in said and ">" not in said and "Ana García" not in said  # quotes and signature stripped
    assert first.message["In-Reply-To"] == "<a3@client.test>" and first.message["Subject"] == "Re: Reserva"
    assert first.message["References"].split() == ["<a1@client.test>", "<a2@client.test>", "<a3@client.test>"]
    assert first.message["Auto-Submitted"] == "auto-replied" and first.sender == imap.USER
    assert smtp.busy_answered == 1 and not any(ledger.RECOVERY_PREFIX.strip() in body(one) for one in smtp.received)
    answered = "\n".join(body(one) for one in luis)
    assert answered.count("buenas") == answered.count("¿abren el domingo?") == 1
    assert luis[-1].message["In-Reply-To"] == "<b2@client.test>"
    assert len(smtp.refused) == 1 and UnreachableChat.objects.get().chat_id == "c1@client.test"
    assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == [
        "a1@client.test", "a2@client.test", "a3@client.test", "b1@client.test", "b2@client.test", "c1@client.test",
        "f1@client.test"]
    assert Turn.objects.count() == 3 + len(luis)
    text, upload = to(smtp, LUCIA)  # the ledger's two chunks: the text, then the file (each its own mail)
    assert "mira esta foto" in body(text)
    [attached] = list(message_from_bytes(upload.message.as_bytes(), policy=policy.default).iter_attachments())
    assert attached.get_filename() == "notes.txt" and b"mira esta foto" in attached.get_payload(decode=True)
    assert text.message["In-Reply-To"] == upload.message["In-Reply-To"] == "<f1@client.test>"
    assert upload.message["Subject"] == "Re: Foto"
    assert InboundMessage.objects.get(platform_message_id="f1@client.test").media_type == "photo"
    assert MediaFile.objects.get().state == MediaState.STORED  # fetched again from the mailbox by UID and part

    # A bounce of the reply to Ana: that ledger row unreachable, and her thread with it.
    row = OutboundMessage.objects.get(chat_id="a1@client.test")
    assert row.platform_message_id == first.message["Message-ID"].strip("<>")
    dovecot.deliver(dsn(row.platform_message_id, ANA))
    wait_until(lambda: OutboundMessage.objects.get(pk=row.pk).state == OutboundState.UNREACHABLE, timeout=20,
               message="the bounced reply unreachable")
    assert UnreachableChat.objects.filter(chat_id="a1@client.test").exists()
    assert len(smtp.received) == 3 + len(luis)  # nothing resent

    # The server rebuilt its index (a new UIDVALIDITY): the mailbox read again, nothing answered twice.
    channel = Channel.objects.get(slug="mail1")
    before = channel.poll_offset
    dovecot.recreate()
    dovecot.deliver(mail(LUIS, "gracias", subject="Re: Consulta", message_id="<b3@client.test>",
                         in_reply_to="<b2@client.test>", references="<b1@client.test> <b2@client.test>"))
    # The cursor is stored after the batch's admission commits: both are waited for.
    wait_until(lambda: InboundMessage.objects.filter(platform_message_id="b3@client.test").exists()
               and Channel.objects.get(slug="mail1").poll_offset >> 32 != before >> 32, timeout=30,
               message="the mail after the new UIDVALIDITY admitted, and the new UIDVALIDITY stored")
    assert InboundMessage.objects.count() == 8  # the seven read again stopped at the dedup


def test_a_worker_killed_mid_send_resends_once_with_the_label_as_the_first_line(processes, make_channel, dovecot,
                                                                                smtp):
    add_channel(make_channel, dovecot, smtp)
    doomed = processes.worker(AGENTLOOP_FAILPOINT="ledger.after_send")
    dovecot.deliver(mail(ANA, "¿me confirmas la hora?", subject="Hora", message_id="<k1@client.test>"))
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    dovecot.deliver(mail(LUIS, "otra cosa", subject="Otra", message_id="<k2@client.test>"))  # while no one holds it
    processes.worker()
    wait_until(delivered(2), timeout=30, message="the killed send resent, the mail sent meanwhile answered")
    plain, labelled = to(smtp, ANA)
    assert body(plain) == "Hora\n\n¿me confirmas la hora?"
    assert body(labelled).splitlines()[0] == ledger.RECOVERY_PREFIX.splitlines()[0]
    assert body(labelled).endswith("¿me confirmas la hora?")
    assert labelled.message["In-Reply-To"] == "<k1@client.test>"
    assert [body(one) for one in to(smtp, LUIS)] == ["Otra\n\notra cosa"]
    assert InboundMessage.objects.count() == 2


def test_a_confirmation_answered_three_times_is_applied_once(processes, make_channel, dovecot, smtp):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    add_channel(make_channel, dovecot, smtp, agent="demo")
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    processes.worker()
    dovecot.deliver(mail(ANA, "Confirmo las horas de psicología: lunes a las 10", subject="Cita",
                         message_id="<q1@client.test>"))
    wait_until(lambda: to(smtp, ANA), timeout=30, message="the question mailed")
    [question] = to(smtp, ANA)
    asked = question.message["Message-ID"]
    yes = mail(ANA, f"sí\n\nOn Mon, 7 Dec 2026, bot wrote:\n> {body(question)}", subject="Re: Cita",
               message_id="<q2@client.test>", in_reply_to=asked, references=f"<q1@client.test> {asked}")
    again = mail(ANA, "sí", subject="Re: Cita", message_id="<q3@client.test>", in_reply_to=asked,
                 references=f"<q1@client.test> {asked}")
    dovecot.deliver(yes, yes, again)
    wait_until(lambda: Proposal.objects.filter(state=ProposalState.APPLIED).exists() and len(to(smtp, ANA)) >= 2,
               timeout=30, message="the action applied and told")
    assert CalendarEvent.objects.count() == 1 and Proposal.objects.count() == 1
    # The mails are read in the order delivered; the last may be admitted after the first
    # "sí" applied the action (seen on a loaded run): by then the copy before it was refused.
    wait_until(lambda: InboundMessage.objects.count() >= 3, timeout=30, message="the third mail admitted")
    assert InboundMessage.objects.count() == 3 and CalendarEvent.objects.count() == 1
