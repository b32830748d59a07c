"""handoff: the agent hands its conversation to a person when it is out of its depth;
handoff_to_agent: to another agent of the channel (conversations.routing).

Behind the guard like any effect (claimed before, confirmed after; asked twice in the
window, done once). Tools of this app, not of tools': what they do is conversations'
own (conversations.handoff.take_over, conversations.routing), and the registry loads
them by dotted path (agentloop/wiring.py TOOLS) like any tool. The turn that calls
`handoff` has fired an effect, so it finishes and its answer ("a person will reply")
goes out; from then on the agent is silent until the person gives the conversation back."""

from __future__ import annotations

from typing import Any

from conversations.handoff import take_over
from conversations.routing import hand_over_for_tool
from tools.registry import Effect, Tool, ToolCall, ToolError


class Handoff(Tool):
    name = "handoff"
    description = ("Hand this conversation to a person (a human operator) when you cannot help: the user asks "
                   "for a person, or the request is beyond what you may do. After it, you stop answering until "
                   "the person gives the conversation back. Tell the user a person will reply.")
    parameters = {
        "type": "object",
        "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 300,
                                  "description": "Why a person is needed, for the operator."}},
        "required": ["reason"],
        "additionalProperties": False,
    }
    effect = Effect.UPDATE
    # No argument is the action's identity (a field no call carries): one handoff per
    # contact (the guard's scope) in the window, whatever the reason's wording.
    fingerprint_fields = ("conversation",)

    def run(self, call: ToolCall) -> dict[str, Any]:
        if call.scope.conversation_id is None:
            raise ToolError("handoff needs a conversation: it is for agents answering a chat")
        taken = take_over(call.scope.conversation_id, by="agent", reason=call.arguments["reason"])
        return {"handed_to_a_person": True, "already_held": not taken,
                "note": "A person now holds this conversation; tell the user a person will reply shortly."}


class HandoffToAgent(Tool):
    """handoff_to_agent: the agent hands its conversation to another agent of the channel
    (a routing rule's, by its name: conversations.routing). Guarded like any effect: the
    same agent asked twice in the window is one handoff. The turn that calls it finishes
    (its answer goes out); the conversation's next turns go to that agent until /reset."""

    name = "handoff_to_agent"
    description = ("Hand this conversation to another agent of this channel, by its name, when the user's request "
                   "is that agent's work (sales, support…). Your answer to this message still goes out; from the "
                   "next message on, the other agent answers.")
    parameters = {
        "type": "object",
        "properties": {
            "agent": {"type": "string", "minLength": 1, "maxLength": 50,
                      "description": "The agent's name in this channel (a routing rule's name)."},
            "reason": {"type": "string", "minLength": 1, "maxLength": 300,
                       "description": "Why, for the operator and the audit trail."},
        },
        "required": ["agent", "reason"],
        "additionalProperties": False,
    }
    effect = Effect.UPDATE
    # The agent asked for is the action: asked twice (whatever the reason's wording), once.
    fingerprint_fields = ("agent",)

    def run(self, call: ToolCall) -> dict[str, Any]:
        if call.scope.conversation_id is None:
            raise ToolError("handoff_to_agent needs a conversation: it is for agents answering a chat")
        agent = call.arguments["agent"]
        moved, problem = hand_over_for_tool(call.scope.conversation_id, agent, call.arguments["reason"])
        if problem:
            raise ToolError(problem)
        return {"handed_to_agent": agent, "already_there": not moved,
                "note": f"From the next message on, the agent {agent} answers this conversation."}
