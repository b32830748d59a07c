"""The tool registry: what an agent may call, what each call does to the world, and
which of its arguments say "this is the same action".

A tool is a class with a `name` usable as an OpenAI function name, a JSON schema of its
arguments, an effect verb, default fingerprint fields and a `run`. Projects add their
own by dotted path (`AGENTLOOP_EXTRA_TOOLS`). Reads are never guarded.
"""

import abc
import enum
import functools
import re
from dataclasses import dataclass, field

import jsonschema
from django.conf import settings
from django.utils.module_loading import import_string

from agentloop.core import plugins
from agentloop.core.caches import BoundedCache
from tools import fingerprint

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Effect(str, enum.Enum):
    READ = "read"
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    SEND = "send"


class ToolError(Exception):
    """The action failed and did not happen: its claim is released, a retry may run."""


class OutcomeUnknown(Exception):
    """The action may or may not have happened (e.g. the connection dropped after the
    request went out): its claim becomes uncertain and is never re-run blindly."""


class CannotReconcile(Exception):
    """The tool cannot look up whether an interrupted action happened."""


class InvalidArguments(ValueError):
    pass


class UnknownTool(LookupError):
    pass


@dataclass(frozen=True)
class Scope:
    """Whose action it is: the fingerprint is unique per scope (a contact, or an API scope)."""

    key: str
    conversation_id: int | None = None
    channel_slug: str = ""
    label: str = ""

    @classmethod
    def of_conversation(cls, conversation):
        """A conversation's actions belong to its contact (in a group: the sender)."""
        return cls(key=f"contact:{conversation.contact_id}", conversation_id=conversation.pk,
                   channel_slug=conversation.channel.slug, label=str(conversation.contact))

    @classmethod
    def of_agent(cls, agent_key_id, name):
        """An explicit scope from the API, namespaced per agent key."""
        return cls(key=f"agent:{agent_key_id}:{name}", label=name)


@dataclass
class ToolCall:
    arguments: dict
    scope: Scope
    # Stable for the guard's claim: tools use it as the effect's own id (an event UID,
    # a Message-ID) so an interrupted call can be looked up afterwards.
    idempotency_key: str = ""
    extra: dict = field(default_factory=dict)


class Tool(abc.ABC):
    name: str = ""
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}}
    effect: Effect = Effect.CREATE
    # Empty: every argument (canonicalised) is the identity of the action.
    fingerprint_fields: tuple = ()
    # field -> function(value, call) giving the value that is hashed.
    normalizers: dict = {}
    # ToolPolicy fields for the policy row created on the tool's first use (operators
    # change them in the admin afterwards).
    policy_defaults: dict = {}

    @property
    def guarded(self):
        return self.effect != Effect.READ

    def validate(self, arguments) -> dict:
        if not isinstance(arguments, dict):
            raise InvalidArguments("arguments must be a JSON object")
        errors = sorted(jsonschema.Draft202012Validator(self.parameters).iter_errors(arguments), key=str)
        if errors:
            where = lambda e: ".".join(str(p) for p in e.absolute_path) or "arguments"  # noqa: E731
            raise InvalidArguments("; ".join(f"{where(e)}: {e.message}" for e in errors[:5]))
        return arguments

    def fingerprint(self, arguments, scope, fields=None):
        return fingerprint.compute(self.name, list(fields or self.fingerprint_fields), arguments,
                                   self.normalizers, scope)

    @abc.abstractmethod
    def run(self, call: ToolCall) -> dict:
        """Carry the action out; return a JSON-serialisable result. Raise ToolError if it
        did not happen, OutcomeUnknown if it may have."""

    def reconcile(self, call: ToolCall) -> dict | None:
        """After an interruption: the effect's result if it happened, None if it surely
        did not. Raise CannotReconcile when the tool cannot tell."""
        raise CannotReconcile(self.name)

    def as_function(self) -> dict:
        """The OpenAI function-calling description."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@functools.lru_cache(maxsize=4)  # keyed by AGENTLOOP_TOOLS: one entry, more only under test overrides
def _load(paths: tuple) -> dict:
    tools = {}
    for path in paths:
        tool = import_string(path)()
        if not NAME_PATTERN.match(tool.name):
            raise ValueError(f"{path}: tool name {tool.name!r} is not a valid function name")
        if tool.name in tools:
            raise ValueError(f"{path}: tool {tool.name!r} is registered twice")
        tools[tool.name] = tool
    return tools


def all_tools() -> dict:
    return _load(tuple(settings.AGENTLOOP_TOOLS))


def get(name: str) -> Tool:
    """A hosted tool, else a registered MCP server's (offered as `<server>__<tool>`)."""
    try:
        return all_tools()[name]
    except KeyError:
        pass
    found = _from_sources.get(name)
    if found is not None:
        return found
    # Other sources of tools, asked in turn for a name the registry does not host: the MCP
    # servers' tools (tools.mcp.catalog.tool). Named by settings.TOOL_SOURCES, as the hosted
    # tools are by AGENTLOOP_TOOLS: they build Tools, so they import this module, not the
    # other way round.
    for source in plugins.each("TOOL_SOURCES"):
        found = source(name)
        if found is not None:
            return _from_sources.set(name, found)
    raise UnknownTool(f"unknown tool {name!r}")


# The sources' tools, kept as long as policies are (tools.guard.policies): a change applies within 2 s.
_from_sources = BoundedCache(maxsize=1024, max_age=2.0)


def forget_sources():
    _from_sources.clear()
