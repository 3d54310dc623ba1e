"""Schedules (§8.7): recurring work with one stable cancellation handle S.

    status      role        transitions
    scheduled   ready       -> scheduled | collecting | complete | aborted | failed
    collecting  ready       -> scheduled | complete | aborted
    complete, aborted, failed   terminal

``scheduled`` waits for its ``not_before`` (the next due time). When it is ready, ONE command
``{ create action J; S collecting after:[J] }``: J is a job or a subagent owner, created as
S's detached background work. ``collecting`` waits for J to be terminal (a dependency, §5.3);
then ONE command ``{ record J's outcome reference; S scheduled with the next not_before and
after:[], or complete }``. One J at a time: runs missed while J ran are planned when S is
next ready.

The recurrence (``pico.application.recurrence``) is persisted in S's state with the last due
time launched and the runs done, so after downtime the missed-run policy decides how many
actions run (skip, once, or at most N newest), never the backlog. A ``catch_up`` plan's
later due times wait in ``backlog`` and launch one after another. Recovery needs nothing
but the stored record: a ready S with a live J is not executed (its dependency), so no
second J is created while collecting. ``abort_background(S)`` marks S and its unfinished J
in one command; S settles ``aborted`` without waiting for J, whose own abort stops it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pico.application.clock import Clock
from pico.application.command import Command
from pico.application.flows.common import AgentServices, task_state
from pico.application.flows.job import JobServices, create_job
from pico.application.flows.subagent import launch
from pico.application.recurrence import Recurrence, first_run, plan
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.errors import (
    CommandRejectedError,
    InvalidArgumentError,
    PicoError,
    TaskDefinitionError,
)
from pico.domain.json import JsonObject, JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = ["ScheduleDefinition", "create_schedule", "subagent_action"]


def subagent_action(
    prompt: JsonValue, *, context: str = "fresh", tools: list[str] | None = None
) -> JsonObject:
    """A schedule action that starts a subagent with ``prompt`` each run."""
    return {"subagent": {"prompt": prompt, "context": context, "tools": tools}}  # type: ignore[dict-item]


def create_schedule(
    tx: Command,
    conversation_id: int,
    recurrence: Recurrence,
    action: JsonObject,
    *,
    now: float,
) -> int:
    """Create S (``scheduled`` at the first due time) in the caller's command."""
    first = first_run(recurrence, now=now)
    if first is None:
        raise InvalidArgumentError(
            "the recurrence has no run: its until is before the first due time; move until "
            "later or drop it"
        )
    state: JsonObject = {
        "recurrence": recurrence.to_json(),
        "action": action,
        "last_due": now,
        "runs_done": 0,
        "skipped": 0,
        "backlog": [],
        "next": first,
        "current": None,
        "last_run": None,
        "outcomes": {},
    }
    return tx.create_task(
        conversation_id, "schedule", status="scheduled", not_before=first, state=state
    )


class ScheduleDefinition(TaskDefinition):
    kind = "schedule"
    initial_status = "scheduled"
    roles: dict[str, Role] = {
        "scheduled": "ready",
        "collecting": "ready",  # after:[J]: ready once J is terminal
        "complete": "terminal",
        "aborted": "terminal",
        "failed": "terminal",
    }
    transitions = {
        "scheduled": ["scheduled", "collecting", "complete", "aborted", "failed"],
        "collecting": ["scheduled", "complete", "aborted"],
    }

    def __init__(
        self,
        jobs: JobServices,
        clock: Clock,
        agents: Callable[[], AgentServices | None],
    ) -> None:
        self.jobs = jobs
        self.clock = clock
        self.agents = agents

    def validate_state(self, value: JsonValue) -> JsonValue:
        if not isinstance(value, dict):
            raise ValueError("a schedule's state is a JSON object")
        try:
            Recurrence.from_json(value.get("recurrence"))
        except InvalidArgumentError as exc:
            raise ValueError(f"its recurrence is invalid: {exc}") from None
        action = value.get("action")
        if (
            not isinstance(action, dict)
            or len(action) != 1
            or not (isinstance(action.get("job"), dict) or isinstance(action.get("subagent"), dict))
        ):
            raise ValueError('a schedule\'s action is {"job": {...}} or {"subagent": {...}}')
        return value

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        if task.status == "collecting":
            await ctx.command(lambda tx: self._collect(tx, task, state))
        else:
            now = self.clock.now()
            await ctx.command(lambda tx: self._run(tx, task, state, now))

    def _run(
        self, tx: Command, task: TaskSnapshot, state: dict[str, JsonValue], now: float
    ) -> None:
        """S is due: launch the next backlog time, or plan from the last due time."""
        if tx.abort_marked(task.id) is not False:
            return  # cancellation won: the abort handler settles
        backlog = [t for t in _list(state.get("backlog")) if isinstance(t, (int, float))]
        if not backlog:
            rec = Recurrence.from_json(state.get("recurrence"))
            last_due = _number(state.get("last_due"))
            runs_done = _int(state.get("runs_done"))
            p = plan(rec, last_due=last_due, runs_done=runs_done, now=now)
            state = {
                **state,
                "skipped": _int(state.get("skipped")) + p.skipped,
                "next": p.next_not_before,
            }
            if not p.due:
                state["last_due"] = last_due if p.latest is None else p.latest
                if p.next_not_before is None:
                    tx.patch_task(task.id, status="complete", state=state)
                else:
                    tx.patch_task(
                        task.id, status="scheduled", state=state, not_before=p.next_not_before
                    )
                return
            backlog = list(p.due)
        due, rest = backlog[0], backlog[1:]
        try:
            action = self._create_action(tx, task, state)
        except PicoError as exc:  # e.g. no provider now, or a tool no longer registered
            tx.patch_task(
                task.id, status="failed", state={**state, "reason": f"the action failed: {exc}"}
            )
            return
        tx.patch_task(
            task.id,
            status="collecting",
            after=[action],
            not_before=None,
            state={
                **state,
                "last_due": due,
                "runs_done": _int(state.get("runs_done")) + 1,
                "backlog": list[JsonValue](rest),
                "current": {"due": due, "task": action},
            },
        )

    def _create_action(self, tx: Command, task: TaskSnapshot, state: dict[str, JsonValue]) -> int:
        action = state.get("action")
        assert isinstance(action, dict)
        job = action.get("job")
        if isinstance(job, dict):
            spec = {k: v for k, v in job.items() if k != "directory"}
            return create_job(tx, self.jobs, task.conversation_id, spec, spawned_by=task.id)
        sub = action.get("subagent")
        assert isinstance(sub, dict)
        services = self.agents()
        if services is None:
            raise CommandRejectedError(
                "a subagent action needs a harness with a model provider: open it with "
                "Harness.open(provider=...)"
            )
        tools = sub.get("tools")
        return launch(
            tx,
            services,
            task.conversation_id,
            sub.get("prompt"),
            context=str(sub.get("context", "fresh")),
            tools=None if tools is None else [str(t) for t in _list(tools)],
            spawned_by=task.id,
        )

    def _collect(self, tx: Command, task: TaskSnapshot, state: dict[str, JsonValue]) -> None:
        """J is terminal: record its outcome and schedule the next run (or complete)."""
        if tx.abort_marked(task.id) is not False:
            return
        current = state.get("current")
        current = current if isinstance(current, dict) else {}
        action_id = current.get("task")
        action = tx.get_task(action_id) if isinstance(action_id, int) else None
        outcomes = state.get("outcomes")
        outcomes = dict(outcomes) if isinstance(outcomes, dict) else {}
        status = "missing" if action is None else action.status
        outcomes[status] = _int(outcomes.get(status)) + 1
        last_run: JsonObject = {"due": current.get("due"), **_reference(action, action_id)}
        state = {**state, "current": None, "last_run": last_run, "outcomes": outcomes}
        backlog = _list(state.get("backlog"))
        upcoming = backlog[0] if backlog else state.get("next")
        if not isinstance(upcoming, (int, float)):
            tx.patch_task(task.id, status="complete", after=[], state=state)
            return
        tx.patch_task(
            task.id, status="scheduled", after=[], not_before=float(upcoming), state=state
        )

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        raise TaskDefinitionError(f"schedule task {task.id} has no inflight status to recover")

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        final = {**state, "reason": "cancelled"}
        await ctx.command(lambda tx: tx.patch_task(task.id, status="aborted", state=final))


def _reference(action: TaskSnapshot | None, action_id: Any) -> JsonObject:
    """J's outcome reference: its id and status, and how a job ended."""
    if action is None:
        return {"task": action_id if isinstance(action_id, int) else None, "status": "missing"}
    out: JsonObject = {"task": action.id, "kind": action.kind, "status": action.status}
    state = task_state(action)
    result = state.get("result")
    if isinstance(result, dict):
        for key in ("exit_code", "signal", "entry_id"):
            if key in result:
                out[key] = result[key]
    return out


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _int(value: JsonValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: JsonValue) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TaskDefinitionError(f"a schedule's last_due must be a number, got {value!r}")
