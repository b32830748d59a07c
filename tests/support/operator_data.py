"""A row of every table the admin shows, made as the product makes them where it can (a
message admitted, a buffer flushed into a turn, a tool call waiting for an operator, a
duplicate caught, a reply given up on, a person taking over), with texts as long as
people write them: the operator pages' browser test (tests/end_to_end/
test_operator_pages_browser.py) and scripts/screenshots.py both plant it.

The texts we write here hold no English domain word (channel, turn, reply, …), so that
any such word on a Spanish page is the product's, never ours."""

from dataclasses import dataclass, field
from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone

# 10,000 characters, with what people paste: a long link, unbroken.
LINK = "https://reservas.example.org/agenda?" + "&".join(f"hora{n}=martes-10-00-consulta" for n in range(8))
LONG_MESSAGE = (("Necesito reagendar todas mis horas de psicología del mes, por favor. " * 80) + LINK + " "
                + "Gracias de antemano, quedo atenta. " * 200)[:10_000]
LONG_ANSWER = ("Listo: dejé tus horas del martes a las 10 y te envío el detalle de cada una. " * 140)[:10_000]
LONG_NAME = "María de los Ángeles Fernández-Villalobos Santa Cruz de la Sierra Montenegro y Altamirano"
LONG_TITLE = ("Sesión de psicología con la doctora Valentina Ortúzar, sala tres, segundo piso " * 4)[:300]
LONG_PLACE = "Avenida-Providencia-1234-oficina-56-Santiago-Centro-" * 5  # unbroken, 260 characters
SHORT = {"message": "¿me agendas psicología el martes a las 10?",
         "answer": "Listo: martes 1 de diciembre a las 10:00, psicología.", "name": "Ana Rojas",
         "title": "Psicología", "place": "Providencia 1234"}


@dataclass
class Planted:
    """What was made, for a test to open: the conversation holding the long message."""

    conversation: object
    operator: tuple[str, str]
    texts: list[str] = field(default_factory=list)


def plant(long: bool = True) -> Planted:
    """Every table the admin lists gets at least one row. long=False: the same with short
    texts (the docs' screenshots)."""
    texts = (LONG_MESSAGE, LONG_ANSWER, LONG_NAME, LONG_TITLE, LONG_PLACE) if long else \
        tuple(SHORT[k] for k in ("message", "answer", "name", "title", "place"))
    message, answer, name, title, place = texts
    olga = User.objects.create_superuser("olga", "olga@example.com", "pw-olga-pages-1")
    conversation = _conversation(message, answer, name)
    _playground(olga)
    _guard(conversation, title, place)
    _ledger(conversation, answer)
    _machinery(conversation)
    return Planted(conversation, ("olga", "pw-olga-pages-1"), list(texts))


def _conversation(message, answer, name):
    """An API channel's conversation: a message admitted and flushed into a turn, which
    answered; a second message waiting in a buffer; a person holding it now."""
    from conversations import flushing, handoff
    from conversations.ingest import Inbound, admit
    from conversations.models import AgentKey, Channel, ContextNote, Conversation, MediaFile, Turn

    channel = Channel.objects.create(slug="tienda", kind="api", agent="echo")
    Channel.objects.create(slug="pruebas", kind="webchat", agent="demo")
    AgentKey.objects.issue("asistente", [channel])
    start = timezone.now() - timedelta(minutes=5)
    admit(channel, Inbound(platform_message_id="1", chat_id="56911", sender_id="56911", sender_name=name, text=message),
          now=start)
    flushing.flush_due(now=start + timedelta(seconds=30))
    Turn.objects.filter(conversation__channel=channel).update(state="done", reply_text=answer, started_at=start,
                                                              finished_at=start + timedelta(seconds=4))
    conversation = Conversation.objects.get(channel=channel)
    admit(channel, Inbound(platform_message_id="2", chat_id="56911", sender_id="56911", sender_name=name,
                           text="¿sigue en pie?"), now=timezone.now())
    handoff.take_over(conversation.pk, "console:olga")
    handoff.reply(conversation.pk, "Soy Olga, te ayudo yo.", "console:olga")
    ContextNote.objects.create(conversation=conversation, text=answer)
    MediaFile.objects.create(channel=channel, file_key="foto-1", ref="foto-1", kind="photo", file_name="receta.jpg")
    return conversation


def _playground(olga):
    """olga's own chat in the playground: two messages merged into one turn, answered."""
    from conversations import flushing
    from conversations.ingest import Inbound, admit
    from conversations.models import Channel, Conversation, Turn
    from delivery import ledger
    from delivery.models import OutboundKind

    channel, me = Channel.objects.get(slug="pruebas"), f"console-{olga.pk}"
    start = timezone.now() - timedelta(minutes=2)
    for n, text in enumerate(("Hola", SHORT["message"])):
        admit(channel, Inbound(platform_message_id=f"console:{n}", chat_id=me, sender_id=me, sender_name="olga",
                               username="olga", text=text), now=start + timedelta(seconds=n))
    flushing.flush_due(now=start + timedelta(seconds=30))
    turn = Turn.objects.get(conversation__channel=channel)
    Turn.objects.filter(pk=turn.pk).update(state="done", reply_text=SHORT["answer"], finished_at=start + timedelta(seconds=33))
    ledger.enqueue(Conversation.objects.get(channel=channel), SHORT["answer"], kind=OutboundKind.REPLY, turn=turn)


def _guard(conversation, title, place):
    """A proposal waiting for an operator, with long arguments; an event made and its
    repeat caught as a duplicate (its claim, its calendar, its audit)."""
    from tools import guard
    from tools.models import ToolPolicy
    from tools.registry import Scope

    scope = Scope.of_conversation(conversation)
    event = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}
    guard.invoke("calendar_create_event", event, scope, actor="agente")
    guard.invoke("calendar_create_event", event, scope, actor="agente")  # the repeat: caught
    guard.policy_for("email_send")
    ToolPolicy.objects.filter(name="calendar_create_event").update(approval="operator")
    guard.forget_policies()
    guard.invoke("calendar_create_event", {"title": title, "start_datetime": "2026-12-08T10:00", "location": place,
                                           "description": title * 3}, scope, actor="agente")


def _ledger(conversation, answer):
    """The long reply waiting in the ledger, and one given up on (its chat unreachable)."""
    from delivery import ledger
    from delivery.models import OutboundKind, Outcome, ScheduledMessage
    from delivery.transports import SendResult

    ledger.enqueue(conversation, answer, kind=OutboundKind.REPLY)
    blocked = ledger.enqueue(conversation, "¿sigue en pie tu hora?", kind=OutboundKind.REPLY)
    [claimed] = ledger.claim_many([blocked.pk], "w1")
    ledger.finish(claimed, "w1", SendResult.failed(Outcome.PERMANENT, "Forbidden: bloqueado por la persona"))
    ScheduledMessage.objects.create(conversation=conversation, text=answer,
                                    due_at=timezone.now() + timedelta(days=1), repeat_every=timedelta(days=7))


def _machinery(conversation):
    """The tables the product's machinery fills: a worker, an MCP server and its tool, the
    background tasks (django-q), the login lockouts (django-axes)."""
    import os
    import socket

    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from django_q.models import Failure, OrmQ, Schedule, Success

    from conversations.models import WorkerHeartbeat
    from tools.models import McpServer, McpTool

    WorkerHeartbeat.objects.create(owner=f"pages:{os.getpid()}", hostname=socket.gethostname(), pid=os.getpid())
    server = McpServer.objects.create(name="agenda", url="https://mcp.example.org/mcp")
    server.channels.add(conversation.channel)
    McpTool.objects.create(server=server, name="buscar_horas", offered_as="agenda__buscar_horas",
                           description="Horas libres de la semana.")
    now = timezone.now()
    Schedule.objects.create(name="limpieza", func="conversations.retention.sweep", schedule_type=Schedule.HOURLY)
    for model, success in ((Success, True), (Failure, False)):
        model.objects.create(id=f"tarea-{success}", name=f"tarea-{success}", func="conversations.retention.sweep",
                             started=now, stopped=now, success=success)
    OrmQ.objects.create(key="agentloop", payload="e30=", lock=now)
    seen = {"user_agent": "Mozilla/5.0", "ip_address": "203.0.113.9", "username": "intruso",
            "http_accept": "text/html", "path_info": "/admin/login/"}
    AccessAttempt.objects.create(**seen, get_data="", post_data="", failures_since_start=3)
    AccessFailureLog.objects.create(**seen, locked_out=False)
    AccessLog.objects.create(**{k: v for k, v in seen.items()}, attempt_time=now)
