"""Task definitions: replaceable units of behaviour (§5.2, §5.8).

A definition maps its statuses to generic roles, lists allowed transitions and validates
state. The harness derives a task's role from its status on every write, so role is never
independently editable, and it refuses to open a session whose live tasks have no
definition or an unknown status, before any execution starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pico.domain.errors import TaskDefinitionError
from pico.domain.json import JsonValue
from pico.domain.task import ROLES, Role
from pico.domain.values import TaskSnapshot

if TYPE_CHECKING:
    from pico.application.command import Command
    from pico.application.ports import ReadPort
    from pico.application.state import WorkingScope

__all__ = ["Reconcile", "StopSignal", "TaskDefinition", "TaskExecution", "TaskRegistry"]

T = TypeVar("T")


class StopSignal(asyncio.Event):
    """An execution's stop signal (``TaskExecution.signal``): an ``asyncio.Event`` that
    also runs the callbacks registered with ``on_set`` when it is set, so an effect can be
    stopped where it waits without a task of its own watching the event (a model stream:
    ``flows/streaming.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` (once) when the signal is set; returns the function that
        unregisters it. Not called when the signal is already set: check first."""
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):  # already run
                self._callbacks.remove(callback)

        return remove


class TaskExecution(Protocol):
    """What an executing definition receives (§9.3): the execution's cancellation signal,
    its working scope, committed reads and serialized command access. Supplied by the
    scheduler (``pico.Execution``); declared here so a definition's ``execute``,
    ``recover`` and ``abort`` can use all of it without narrowing their signature."""

    @property
    def task_id(self) -> int: ...

    @property
    def signal(self) -> asyncio.Event:
        """Set when this execution should stop (abort, close, shutdown)."""
        ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def working_scope(self) -> WorkingScope: ...

    @property
    def reads(self) -> ReadPort:
        """Committed conversation and entry reads."""
        ...

    def task(self, task_id: int) -> TaskSnapshot | None:
        """Any committed task record (e.g. a dependency's outcome)."""
        ...

    def current(self) -> TaskSnapshot:
        """This task's committed record, re-read."""
        ...

    async def command(
        self, build: Callable[[Command], T | Awaitable[T]], *, defer: bool = False
    ) -> T:
        """Run a command as this execution; ``StaleExecutionError`` once it has ended."""
        ...

    async def working(self, build: Callable[[Any], T | Awaitable[T]]) -> T:
        """A working-scope command in this execution's own scope."""
        ...

    def observe(
        self,
        subscribe: Callable[[Callable[[Any], None]], Callable[[], None]],
        reconcile: Reconcile,
        *,
        promised: bool = False,
    ) -> None:
        """Install a live-phase observer for this waiting task (see ``pico.Execution``)."""
        ...


#: A waiting task's reconciliation: called with each observed event (None first) and a
#: fresh execution context under the task's claim.
Reconcile = Callable[[Any, TaskExecution], Awaitable[None]]


class TaskDefinition(ABC):
    """Subclass per kind. ``roles`` maps every status to ready | inflight | waiting |
    terminal; ``transitions`` lists the statuses each status may move to."""

    kind: str
    initial_status: str
    roles: Mapping[str, Role]
    transitions: Mapping[str, Sequence[str]]

    def validate_state(self, value: JsonValue) -> JsonValue:
        """Return the state to store, or raise ``ValueError``/``TypeError`` to reject it."""
        return value

    @abstractmethod
    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Run a ready task: commit durable intent before external work (§5.8)."""

    @abstractmethod
    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Resume an inflight task, or re-arm a waiting one, after a restart."""

    @abstractmethod
    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Settle a task marked for cancellation, keeping required result records."""

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Reject a malformed definition at registration."""
        if not getattr(self, "kind", None):
            raise TaskDefinitionError(f"{type(self).__name__} has no kind")
        for status, role in self.roles.items():
            if role not in ROLES:
                raise TaskDefinitionError(
                    f"definition {self.kind!r}: status {status!r} maps to role {role!r}; "
                    f"roles are {ROLES}"
                )
        if self.initial_status not in self.roles:
            raise TaskDefinitionError(
                f"definition {self.kind!r}: initial status {self.initial_status!r} has no role"
            )
        for status, targets in self.transitions.items():
            for target in (status, *targets):
                if target not in self.roles:
                    raise TaskDefinitionError(
                        f"definition {self.kind!r}: transition names unknown status {target!r}"
                    )

    def role_of(self, status: str, *, task_id: int | None = None) -> Role:
        role = self.roles.get(status)
        if role is None:
            where = "" if task_id is None else f" (task {task_id})"
            raise TaskDefinitionError(
                f"task kind {self.kind!r} has no status {status!r}{where}; known statuses: "
                f"{sorted(self.roles)}"
            )
        return role

    def check_transition(self, task_id: int, current: str, new: str) -> None:
        if new != current and new not in self.transitions.get(current, ()):
            raise TaskDefinitionError(
                f"task {task_id} ({self.kind!r}) cannot move from {current!r} to {new!r}; "
                f"allowed: {list(self.transitions.get(current, ()))}"
            )

    def check_state(self, task_id: int | None, value: JsonValue) -> JsonValue:
        try:
            return self.validate_state(value)
        except (ValueError, TypeError) as exc:
            what = "new task" if task_id is None else f"task {task_id}"
            raise TaskDefinitionError(
                f"{what} ({self.kind!r}): state rejected by its definition: {exc}"
            ) from exc


#: The kinds of the built-in agent flows (``pico.application.flows``), registered with a
#: model provider.
BUILT_IN_KINDS = frozenset({"approval", "collapse", "generation", "post_tools", "subagent", "tool"})


class TaskRegistry:
    """Definitions by kind. No global registry: pass one to ``Harness.open``."""

    def __init__(self, definitions: Iterable[TaskDefinition] = ()) -> None:
        self._by_kind: dict[str, TaskDefinition] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: TaskDefinition) -> None:
        definition.check()
        if definition.kind in self._by_kind:
            raise TaskDefinitionError(f"task kind {definition.kind!r} is registered twice")
        self._by_kind[definition.kind] = definition

    def get(self, kind: str) -> TaskDefinition:
        found = self._by_kind.get(kind)
        if found is None and kind in BUILT_IN_KINDS:
            raise TaskDefinitionError(
                f"task kind {kind!r} belongs to the built-in agent flows, which are registered "
                "only for a harness with a model: open it with Harness.open(provider=...)"
            )
        if found is None:
            raise TaskDefinitionError(
                f"no definition is registered for task kind {kind!r}; pass it to "
                "Harness.open(definitions=...)"
            )
        return found

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)

    def validate_live(self, tasks: Iterable[TaskSnapshot]) -> None:
        """§5.2: unknown live kinds and invalid live statuses reject restoration."""
        for task in tasks:
            definition = self.get(task.kind)
            role = definition.role_of(task.status, task_id=task.id)
            if role != task.role:
                raise TaskDefinitionError(
                    f"task {task.id} ({task.kind!r}) is stored with role {task.role!r} but its "
                    f"definition maps status {task.status!r} to {role!r}; migrate the stored "
                    "tasks or fix the definition"
                )
