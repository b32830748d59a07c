"""A migration operation for labels only: verbose names, help texts, choices' labels.

Django writes each changed label as an AlterField (or AlterModelOptions), and each one, as
`migrate` applies it to a rendered project state, re-renders its model and every model
related to it. 390 of them (the admin's translation, issue 53) made every migrate that
crosses them, back or forth, minutes slower. Labels change no column and no relation: this
operation applies them all to the state with the rendered models set aside, and lets the
state render once, when next asked, from the model states it now holds. The autodetector
sees the same state either way (`makemigrations --check`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import migrations

if TYPE_CHECKING:
    from django.db.migrations.operations.base import Operation
    from django.db.migrations.state import ProjectState


class AlterLabels(migrations.SeparateDatabaseAndState):
    """`state_operations`: AlterField / AlterModelOptions that change labels only. No
    database operation: a label is not in the schema."""

    def __init__(self, state_operations: Sequence[Operation]) -> None:
        super().__init__(database_operations=[], state_operations=state_operations)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [], {"state_operations": self.state_operations}

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        # Without `apps` in it, the state reloads nothing per operation (ProjectState.reload_model).
        state.__dict__.pop("apps", None)
        for operation in self.state_operations:
            operation.state_forwards(app_label, state)

    def describe(self) -> str:
        return f"Labels of {len(self.state_operations)} fields and models (no database change)"
