"""What a guarded call gets back: its status and, for the model, what to say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentloop.core.redaction import redact


class Status:
    DONE = "done"  # it ran now
    DUPLICATE = "duplicate"  # already done within the window: not run again
    IN_PROGRESS = "in_progress"  # an identical call is running right now
    UNCERTAIN = "uncertain"  # an identical call was interrupted: it may have happened
    AWAITING_APPROVAL = "awaiting_approval"  # a person must apply it first
    FAILED = "failed"  # it ran and failed; nothing happened


@dataclass
class Outcome:
    status: str
    result: Any = None  # the tool's JSON result
    note: str = ""
    error: str = ""
    claim_id: int | None = None
    proposal_id: int | None = None
    original: dict[str, Any] | None = None
    # An identical call got here first: this one was not carried out (said to the model).
    duplicate: bool = False

    def __post_init__(self) -> None:
        # Redacted where every outcome is built: a tool's error (or an interrupted call's
        # note) may quote a key or a URL with credentials, and this text goes to the model
        # provider, to an agent key's invoke answer and into the conversation's notes.
        self.error, self.note = redact(self.error), redact(self.note)

    def for_model(self) -> dict[str, Any]:
        """What the model gets back as the tool's result: never an error for a duplicate."""
        body: dict[str, Any] = {"status": self.status, "duplicate": self.duplicate}
        if self.note:
            body["note"] = self.note
        if self.status == Status.FAILED:
            body["error"] = self.error
        if self.result is not None:
            body["result"] = self.result
        if self.original is not None:
            body["original"] = self.original
        if self.proposal_id is not None:
            body["proposal"] = self.proposal_id
        return body
