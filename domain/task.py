"""The Task aggregate: durable work associated with one conversation (§5.1, §6.1).

The record holds what was asked and where it stands: kind, status and the generic role the
definition derives from it, validated JSON state, dependencies, foreground choice,
provenance, ownership and scheduling metadata. Behaviour lives in task definitions
(application layer); the scheduler reads only the generic fields.
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from pico.domain.errors import CommandRejectedError, TerminalTaskError
from pico.domain.ids import task_uuid
from pico.domain.trigger import create_aggregate
from pico.domain.trigger import trigger_event as fast_trigger_event

__all__ = ["ROLES", "Role", "Task"]

Role = Literal["ready", "inflight", "waiting", "terminal"]
ROLES: tuple[Role, ...] = ("ready", "inflight", "waiting", "terminal")


class Task(Aggregate):
    # The library's trigger_event less its per-event overhead (domain/trigger.py).
    trigger_event = fast_trigger_event

    class Created(Aggregate.Created):
        session_id: str
        task_id: int
        conversation_id: int
        kind: str
        status: str
        role: str
        state: str
        after: list[int]
        foreground: bool
        spawned_by: int | None
        not_before: float | None
        required_permit: str | None

    class Patched(Aggregate.Event):
        """A status/state/scheduling change. ``state`` None keeps the stored state; the
        other fields carry their complete new values."""

        task_id: int
        seq: int
        status: str
        role: str
        state: str | None
        after: list[int]
        not_before: float | None
        required_permit: str | None

        # Applies itself and is triggered directly (Task.patch): the @event decorator's
        # argument binding cost ~5% of a small command (2,000-turn benchmark).
        def apply(self, aggregate: Any) -> None:
            aggregate.status = self.status
            aggregate.role = self.role
            aggregate.after = list(self.after)
            aggregate.not_before = self.not_before
            aggregate.required_permit = self.required_permit

    class AbortRequested(Aggregate.Event):
        """Durable cancellation membership (§6.4); survives restart, never shrinks."""

        task_id: int
        seq: int

    class OwnedConversationLinked(Aggregate.Event):
        """This task owns a child conversation; the conversation's owner link is created in
        the same command (§5.7)."""

        task_id: int
        seq: int
        conversation_id: int

    @staticmethod
    def create_id(session_id: str, task_id: int, **_: Any) -> UUID:
        return task_uuid(session_id, task_id)

    @event(Created)
    def __init__(
        self,
        *,
        session_id: str,
        task_id: int,
        conversation_id: int,
        kind: str,
        status: str,
        role: str,
        state: str,
        after: list[int],
        foreground: bool,
        spawned_by: int | None,
        not_before: float | None,
        required_permit: str | None,
    ) -> None:
        self.session_id = session_id
        self.task_id = task_id
        self.conversation_id = conversation_id
        self.kind = kind
        self.status = status
        self.role = role
        self.after: list[int] = list(after)
        self.foreground = foreground
        self.spawned_by = spawned_by
        self.not_before = not_before
        self.required_permit = required_permit
        self.abort_requested = False
        self.owned_conversation_id: int | None = None

    @classmethod
    def start(cls, **kwargs: Any) -> Task:
        role = kwargs.get("role")
        if role not in ROLES:
            raise CommandRejectedError(f"task role must be one of {ROLES}, not {role!r}")
        # The library's constructor less its per-call overhead (domain/trigger.py).
        task: Task = create_aggregate(cls, cls.Created, **kwargs)
        return task

    @property
    def terminal(self) -> bool:
        return self.role == "terminal"

    def patch(
        self,
        *,
        seq: int,
        status: str,
        role: str,
        state: str | None,
        after: list[int],
        not_before: float | None,
        required_permit: str | None,
    ) -> None:
        if self.terminal:
            raise TerminalTaskError(self.task_id, self.status)
        if role not in ROLES:
            raise CommandRejectedError(f"task role must be one of {ROLES}, not {role!r}")
        self.trigger_event(
            self.Patched,
            task_id=self.task_id,
            seq=seq,
            status=status,
            role=role,
            state=state,
            after=list(after),
            not_before=not_before,
            required_permit=required_permit,
        )

    def request_abort(self, *, seq: int) -> bool:
        """Mark for cancellation; False (and no event) when terminal or already marked."""
        if self.terminal or self.abort_requested:
            return False
        self._abort_requested(task_id=self.task_id, seq=seq)
        return True

    def link_owned_conversation(self, *, seq: int, conversation_id: int) -> None:
        if self.terminal:
            raise TerminalTaskError(self.task_id, self.status)
        if self.owned_conversation_id is not None:
            raise CommandRejectedError(
                f"task {self.task_id} already owns conversation {self.owned_conversation_id}"
            )
        self._owned_conversation_linked(
            task_id=self.task_id, seq=seq, conversation_id=conversation_id
        )

    @event(AbortRequested)
    def _abort_requested(self, task_id: int, seq: int) -> None:
        self.abort_requested = True

    @event(OwnedConversationLinked)
    def _owned_conversation_linked(self, task_id: int, seq: int, conversation_id: int) -> None:
        self.owned_conversation_id = conversation_id
