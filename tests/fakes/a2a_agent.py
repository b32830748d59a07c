"""A real Agent2Agent (A2A) server, written with the official SDK (`a2a-sdk`: an
AgentExecutor behind its JSON-RPC routes and agent card), for the `a2a` agent's tests.
What it does depends on the message:

- "despacio …" (slowly): streams the rest back, a word every `--pace` seconds, as a
  text artifact's chunks, then completes;
- "reserva …" (book): the task asks for input ("¿Para qué día?", input-required); the
  person's next message continues the same task, which completes with "Reservado: <day>"
  and an artifact file `cita.ics`;
- "informe" (report): answers "Aquí está el informe." with an artifact file `informe.txt`;
- "cuelga" (hang): never answers;
- anything else: "Eco <n>: <text>", n counting the messages of the context (the same
  contextId across turns counts on).

Each message it receives is appended to the log file (one JSON line: its text, context
and task ids, metadata, and `task`: the task it is served in); each `tasks/cancel` too
(`{"cancel": <task id>}`). With `--require-key K`, a JSON-RPC request without
`Authorization: Bearer K` is answered 401 (its agent card stays public).

With `--interface-url`, its card names another address to be spoken to.

    python -m tests.fakes.a2a_agent --port N --log FILE [--require-key K] [--pace S] [--interface-url U]
"""

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

from a2a.helpers import (
    get_message_text,
    new_raw_part,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from google.protobuf.json_format import MessageToDict

ICS = b"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nSUMMARY:Cita\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
REPORT = b"Informe de prueba.\nTodo en orden.\n"


class Desk(AgentExecutor):
    def __init__(self, log: Path, pace: float):
        self.log, self.pace = log, pace
        self.said: Counter = Counter()  # messages per context

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = get_message_text(context.message).strip()
        self.record(context, text)
        self.said[context.context_id] += 1
        task = context.current_task
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([new_raw_part(ICS, media_type="text/calendar", filename="cita.ics")],
                                       name="cita")
            await updater.complete(updater.new_agent_message([new_text_part(f"Reservado: {text}.")]))
            return
        word = text.split(" ", 1)[0].lower()
        if word == "cuelga":
            await asyncio.Event().wait()  # never
        if word == "reserva":
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
            await updater.requires_input(updater.new_agent_message([new_text_part("¿Para qué día?")]))
        elif word == "despacio":
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
            await updater.start_work()
            words = text.split(" ")[1:]
            for index, piece in enumerate(words):
                await asyncio.sleep(self.pace)
                await updater.add_artifact([new_text_part(piece + (" " if index < len(words) - 1 else ""))],
                                           artifact_id="answer", name="answer", append=index > 0,
                                           last_chunk=index == len(words) - 1)
            await updater.complete()
        elif word == "informe":
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
            await updater.add_artifact([new_raw_part(REPORT, media_type="text/plain", filename="informe.txt")],
                                       name="informe")
            await updater.complete(updater.new_agent_message([new_text_part("Aquí está el informe.")]))
        else:
            await event_queue.enqueue_event(new_text_message(
                f"Eco {self.said[context.context_id]}: {text}", context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.write({"cancel": context.task_id})
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()

    def record(self, context, text):
        message = context.message
        self.write({"text": text, "context_id": context.context_id, "task_id": message.task_id,
                    "task": context.task_id,
                    "metadata": MessageToDict(message.metadata) if message.HasField("metadata") else {}})

    def write(self, line):
        with self.log.open("a") as out:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


class RequireKey:
    """ASGI: the JSON-RPC endpoint refuses a request without the bearer key."""

    def __init__(self, app, key):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and \
                dict(scope["headers"]).get(b"authorization") != self.expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"a key is needed"})
            return
        await self.app(scope, receive, send)


def card(port: int, interface_url: str = "") -> AgentCard:
    return AgentCard(
        name="Desk", description="A test desk speaking A2A.", version="1.0",
        supported_interfaces=[AgentInterface(url=interface_url or f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="desk", name="desk", description="echoes, streams, books, reports",
                           tags=["test"])])


def build(port: int, log: Path, pace: float = 0.3, key: str = "", interface_url: str = ""):
    from starlette.applications import Starlette

    agent_card = card(port, interface_url)
    handler = DefaultRequestHandler(agent_executor=Desk(log, pace), task_store=InMemoryTaskStore(),
                                    agent_card=agent_card)
    app = Starlette(routes=[*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, rpc_url="/")])
    return RequireKey(app, key) if key else app


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--require-key", default="")
    parser.add_argument("--pace", type=float, default=0.3)
    parser.add_argument("--interface-url", default="", help="where its card says it answers (default: itself)")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(build(args.port, Path(args.log), args.pace, args.require_key, args.interface_url), host="127.0.0.1", port=args.port,
                log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
