"""What a remote A2A agent said in one exchange (conversations.a2a_agent), read from the
SDK's events as they come: the text to preview, then the Answer.

An exchange ends with a Message (the agent answered directly), or with a Task in some
state: `completed` (its artifacts, then its status message, are the reply),
`input-required` (its question is the reply; the next turn continues the task),
`rejected` (its message is the reply), `failed`, `canceled` or `auth-required` (no
reply: the turn fails). An artifact's text parts are text; its files (raw bytes, or
JSON data) are files of the reply; a file given by URL is named in the text with its
link, not fetched.
"""

import json
from dataclasses import dataclass, field

from conversations.agents import Answer, File

# The A2A task states, by their protocol names (a2a.types.a2a_pb2.TaskState's values).
SUBMITTED, WORKING, COMPLETED, FAILED, CANCELED, INPUT_REQUIRED, REJECTED, AUTH_REQUIRED = range(1, 9)
NAMES = {SUBMITTED: "submitted", WORKING: "working", COMPLETED: "completed", FAILED: "failed",
         CANCELED: "canceled", INPUT_REQUIRED: "input-required", REJECTED: "rejected",
         AUTH_REQUIRED: "auth-required"}
# A task in these states has said all it will say in this exchange.
SETTLED = {COMPLETED, FAILED, CANCELED, INPUT_REQUIRED, REJECTED, AUTH_REQUIRED}
ANSWERED = {COMPLETED, INPUT_REQUIRED, REJECTED}


@dataclass
class Reading:
    task_id: str = ""
    context_id: str = ""
    state: int = 0  # TASK_STATE_UNSPECIFIED until a task says
    direct: bool = False  # the agent answered with a Message, no task
    status_text: str = ""
    artifacts: dict = field(default_factory=dict)  # artifact id -> [name, [parts]]
    message_parts: list = field(default_factory=list)
    previewed: str = ""
    source: str = ""  # where the last previewed text came from (an artifact, the status)

    @property
    def settled(self) -> bool:
        return self.direct or self.state in SETTLED

    @property
    def state_name(self) -> str:
        return NAMES.get(self.state, "unknown")

    def take(self, event) -> str:
        """Read one StreamResponse; the text it adds to what the person sees ("" if none)."""
        kind = event.WhichOneof("payload")
        if kind == "message":
            self.direct = True
            self.context_id = event.message.context_id or self.context_id
            self.message_parts = list(event.message.parts)
            return self._preview(_text(self.message_parts), "message")
        if kind == "task":
            self._task(event.task)
            return ""
        if kind == "status_update":
            self._ids(event.status_update)
            return self._preview(self._status(event.status_update.status), "status")
        if kind == "artifact_update":
            self._ids(event.artifact_update)
            artifact = event.artifact_update.artifact
            return self._preview(self._artifact(artifact, event.artifact_update.append), artifact.artifact_id)
        return ""

    def take_task(self, task) -> None:
        """A task as `tasks/get` returns it (a task still working, looked at again)."""
        self._task(task)

    def answer(self) -> Answer:
        """The reply: the artifacts' text and the agent's message, then the files."""
        parts = [part for _, artifact_parts in self.artifacts.values() for part in artifact_parts]
        texts = [_text(artifact_parts) for _, artifact_parts in self.artifacts.values()]
        said = _text(self.message_parts) if self.direct else self.status_text
        if said and said not in texts:
            texts.append(said)
        files = _files(self.message_parts if self.direct else [], self.artifacts)
        links = [f"📎 {part.filename or 'file'}: {part.url}" for part in [*self.message_parts, *parts]
                 if part.WhichOneof("content") == "url"]
        text = "\n\n".join(t for t in [*texts, "\n".join(links)] if t.strip())
        return Answer(text.strip(), files)

    # --- the events -------------------------------------------------------------------

    def _ids(self, update):
        self.task_id = update.task_id or self.task_id
        self.context_id = update.context_id or self.context_id

    def _task(self, task):
        self.task_id, self.context_id = task.id or self.task_id, task.context_id or self.context_id
        self.artifacts = {artifact.artifact_id: [artifact.name, list(artifact.parts)] for artifact in task.artifacts}
        self._status(task.status)

    def _status(self, status) -> str:
        self.state = int(status.state)
        if not status.HasField("message"):
            return ""
        text = _text(status.message.parts)
        # A working task's status messages are progress ("looking it up…"), not the reply.
        if self.state in ANSWERED or self.state in (FAILED, CANCELED, AUTH_REQUIRED):
            self.status_text = text
            return text if self.state in ANSWERED else ""
        return ""

    def _artifact(self, artifact, append) -> str:
        entry = self.artifacts.setdefault(artifact.artifact_id, [artifact.name, []])
        if not append:
            entry[1] = []
        entry[0] = artifact.name or entry[0]
        entry[1].extend(artifact.parts)
        return "".join(part.text for part in artifact.parts if part.WhichOneof("content") == "text")

    def _preview(self, text, source) -> str:
        """The text for the preview: another artifact's, or the status message, after
        earlier text starts a paragraph of its own, as it does in the reply."""
        if not text:
            return ""
        if self.previewed and source != self.source:
            text = "\n\n" + text
        self.previewed, self.source = self.previewed + text, source
        return text


def _text(parts) -> str:
    return "".join(part.text for part in parts if part.WhichOneof("content") == "text").strip()


def _files(message_parts, artifacts) -> tuple[File, ...]:
    found = []
    for name, parts in [("", message_parts), *artifacts.values()]:
        for part in parts:
            content = part.WhichOneof("content")
            if content == "raw":
                found.append(File(name=part.filename or name or "file", data=part.raw or None))
            elif content == "data":
                # Imported here, as the SDK is (a2a_agent.sdk): protobuf's JSON costs every
                # worker start ~15 ms otherwise, A2A channel or not.
                from google.protobuf.json_format import MessageToDict

                data = json.dumps(MessageToDict(part.data), ensure_ascii=False, indent=2).encode()
                found.append(File(name=part.filename or f"{name or 'data'}.json", data=data))
    return tuple(found)
