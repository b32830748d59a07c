"""People named as people on the console's websockets (issue 53), through the real ASGI
application: the dashboard's feed says who took a conversation over and who holds a chat
a message arrives in (olga, never console:olga), in the reader's language; a person's
reply reaches the playground under the person's name as it is sent."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from agentloop.core import live
from conversations import handoff
from conversations.ingest import Inbound, admit
from conversations.models import Conversation
from delivery import ledger
from delivery.models import OutboundKind
from tests.unit.test_console_websockets import (  # noqa: F401 -- `playground` is a fixture
    OPERATE,
    WATCH,
    communicator,
    headers_for,
    make_user,
    playground,
    receive_until,
    talk,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_dashboard_names_the_person_in_spanish(playground):  # noqa: F811
    admit(playground, Inbound("m1", "ana", "ana", sender_name="Ana", text="hola"))
    conversation = Conversation.objects.get()
    handoff.take_over(conversation.pk, "console:olga")
    headers = [*headers_for(make_user("watcher", perms=WATCH)), (b"accept-language", b"es")]

    async def run():
        comm = communicator("/ws/console/dashboard/", headers)
        assert (await comm.connect())[0]
        first = await comm.receive_json_from(timeout=5)
        [taken] = [e for e in first["events"] if e["event"] == "conversation_taken_over"]
        assert taken["actor"] == "olga"
        assert first["labels"]["event"]["conversation_taken_over"] == "Una persona tomó el control de la conversación"
        live.forget_listeners()  # the setup's publishers saw nobody listening, and remember it for a second
        await sync_to_async(admit, thread_sensitive=False)(playground, Inbound("m2", "ana", "ana", text="¿hola?"))
        event = await receive_until(comm, lambda m: m["type"] == "event" and m["event"]["kind"] == "message")
        assert event["event"]["disposition"] == "held" and event["event"]["held_by"] == "olga"
        await comm.disconnect()
    asyncio.run(run())


def test_a_persons_reply_reaches_the_playground_under_her_name(playground):  # noqa: F811
    def person_replies(conversation_id):
        handoff.take_over(conversation_id, "console:olga")
        handoff.reply(conversation_id, "Soy Olga, te ayudo yo.", "console:olga")
        return ledger.claim_due("w1")

    async def body(comm, hello):
        rows = await sync_to_async(person_replies, thread_sensitive=False)(hello["conversation"])
        for row in rows:
            await ledger.send(row)
        reply = await receive_until(comm, lambda m: m["type"] == "event" and m["event"]["kind"] == "reply")
        assert reply["event"]["text"] == "Soy Olga, te ayudo yo." and reply["event"]["by"] == "olga"
    talk("/ws/console/playground/playground/", make_user("op", perms=OPERATE), body)


def test_an_agents_reply_carries_no_person(playground):  # noqa: F811
    async def body(comm, hello):
        conversation = await sync_to_async(Conversation.objects.get, thread_sensitive=False)(pk=hello["conversation"])
        await sync_to_async(ledger.enqueue, thread_sensitive=False)(conversation, "Hola, soy el agente.",
                                                                   kind=OutboundKind.REPLY)
        for row in await sync_to_async(ledger.claim_due, thread_sensitive=False)("w1"):
            await ledger.send(row)
        reply = await receive_until(comm, lambda m: m["type"] == "event" and m["event"]["kind"] == "reply")
        assert reply["event"]["text"] == "Hola, soy el agente." and "by" not in reply["event"]
    talk("/ws/console/playground/playground/", make_user("op", perms=OPERATE), body)
