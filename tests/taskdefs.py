"""Test-only task definitions (the agent flows come with their own issue)."""

from __future__ import annotations

from pico import JsonValue, TaskDefinition, TaskExecution, TaskSnapshot
from pico.domain.task import Role


class JobDefinition(TaskDefinition):
    """The job lifecycle of §5.1: planned -> spawning -> running -> exited/killed/lost."""

    kind = "job"
    initial_status = "planned"
    roles: dict[str, Role] = {
        "planned": "ready",
        "spawning": "inflight",
        "running": "waiting",
        "exited": "terminal",
        "killed": "terminal",
        "lost": "terminal",
    }
    transitions = {
        "planned": ["spawning", "killed"],
        "spawning": ["running", "lost", "killed"],
        "running": ["exited", "killed", "lost"],
    }

    def validate_state(self, value: JsonValue) -> JsonValue:
        if not isinstance(value, dict) or not isinstance(value.get("command"), str):
            raise ValueError('job state needs {"command": "<string>"}')
        return value

    # Execution is the scheduler's business; these record calls for later scheduler tests.
    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("execute", task.id))

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("recover", task.id))

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("abort", task.id))

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []


class NoteDefinition(JobDefinition):
    """A second kind with free-form state, for kind filters."""

    kind = "note"
    initial_status = "planned"

    def validate_state(self, value: JsonValue) -> JsonValue:
        return value


def definitions() -> list[TaskDefinition]:
    return [JobDefinition(), NoteDefinition()]
