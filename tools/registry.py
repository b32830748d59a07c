"""The tool registry: what an agent may call, what each call does to the world, and
which of its arguments say "this is the same action".

A tool is a class with a `name` usable as an OpenAI function name, a JSON schema of its
arguments, an effect verb, default fingerprint fields and a `run`. Projects add their
own by dotted path (`AGENTLOOP_EXTRA_TOOLS`). Reads are never guarded.
"""

from __future__ import annotations

import abc
import enum
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import jsonschema
from django.conf import settings
from django.utils.module_loading import import_string

from agentloop.core import plugins
from agentloop.core.caches import BoundedCache
from tools import fingerprint
from tools.fingerprint import Fingerprint, Normalizer

if TYPE_CHECKING:
    from tools.conversation_side import Conversation

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
    def of_conversation(cls, conversation: Conversation) -> Scope:
        """A conversation's actions belong to its contact (in a group: the sender)."""
        return cls(key=f"contact:{conversation.contact_id}", conversation_id=conversation.pk,
                   channel_slug=conversation.channel.slug, label=str(conversation.contact))

    @classmethod
    def of_agent(cls, agent_key_id: int, name: str) -> Scope:
        """An explicit scope from the API, namespaced per agent key."""
        return cls(key=f"agent:{agent_key_id}:{name}", label=name)


@dataclass
class ToolCall:
    arguments: dict[str, Any]
    scope: Scope
    # Stable for the guard's claim: tools use it as the effect's own id (an event UID,
    # a Message-ID) so an interrupted call can be looked up afterwards.
    idempotency_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Tool(abc.ABC):
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # a JSON schema
    effect: Effect = Effect.CREATE
    # Empty: every argument (canonicalised) is the identity of the action.
    fingerprint_fields: tuple[str, ...] = ()
    # field -> function(value, call) giving the value that is hashed.
    normalizers: Mapping[str, Normalizer] = {}
    # ToolPolicy fields for the policy row created on the tool's first use (operators
    # change them in the admin afterwards).
    policy_defaults: dict[str, Any] = {}

    @property
    def guarded(self) -> bool:
        return self.effect != Effect.READ

    def validate(self, arguments: Any) -> dict[str, Any]:  # JSON as the caller sent it: checked here
        if not isinstance(arguments, dict):
            raise InvalidArguments("arguments must be a JSON object")
        errors = sorted(jsonschema.Draft202012Validator(self.parameters).iter_errors(arguments), key=str)
        if errors:
            raise InvalidArguments("; ".join(f"{_where(e)}: {e.message}" for e in errors[:5]))
        return arguments

    def fingerprint(self, arguments: Mapping[str, Any], scope: Scope,
                    fields: list[str] | tuple[str, ...] | None = None) -> Fingerprint:
        return fingerprint.compute(self.name, list(fields or self.fingerprint_fields), arguments,
                                   self.normalizers, scope)

    @abc.abstractmethod
    def run(self, call: ToolCall) -> dict[str, Any]:
        """Carry the action out; return a JSON-serialisable result. Raise ToolError if it
        did not happen, OutcomeUnknown if it may have."""

    def reconcile(self, call: ToolCall) -> dict[str, Any] | None:
        """After an interruption: the effect's result if it happened, None if it surely
        did not. Raise CannotReconcile when the tool cannot tell."""
        raise CannotReconcile(self.name)

    def as_function(self) -> dict[str, Any]:
        """The OpenAI function-calling description."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def _where(error: Any) -> str:  # a jsonschema ValidationError (jsonschema has no types)
    return ".".join(str(p) for p in error.absolute_path) or "arguments"


@functools.lru_cache(maxsize=4)  # keyed by AGENTLOOP_TOOLS: one entry, more only under test overrides
def _load(paths: tuple[str, ...]) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    for path in paths:
        tool: Tool = import_string(path)()
        if not NAME_PATTERN.match(tool.name):
            raise ValueError(f"{path}: tool name {tool.name!r} is not a valid function name")
        if tool.name in tools:
            raise ValueError(f"{path}: tool {tool.name!r} is registered twice")
        tools[tool.name] = tool
    return tools


def all_tools() -> dict[str, Tool]:
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
    # servers' tools (tools.mcp.catalog.tool). Named by settings.AGENTLOOP_TOOL_SOURCES, as the hosted
    # tools are by AGENTLOOP_TOOLS: they build Tools, so they import this module, not the
    # other way round.
    for source in cast("tuple[Callable[[str], Tool | None], ...]", plugins.each("AGENTLOOP_TOOL_SOURCES")):
        found = source(name)
        if found is not None:
            return _from_sources.set(name, found)
    raise UnknownTool(f"unknown tool {name!r}")


# The sources' tools, kept as long as policies are (tools.guard.policies): a change applies within 2 s.
_from_sources: BoundedCache[str, Tool] = BoundedCache(maxsize=1024, max_age=2.0)


def forget_sources() -> None:
    _from_sources.clear()
