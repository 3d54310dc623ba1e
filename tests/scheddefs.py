"""A scripted task definition for scheduler tests: each handler can be replaced by the
test, and every call is recorded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pico import JsonValue, TaskDefinition, TaskSnapshot
from pico.application.tasks import TaskExecution
from pico.domain.task import Role

Handler = Callable[[TaskSnapshot, TaskExecution], Awaitable[None]]


async def settle(ctx: TaskExecution, status: str) -> None:
    await ctx.command(lambda tx: tx.patch_task(ctx.task_id, status=status))


class Scripted(TaskDefinition):
    kind = "work"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "ready",
        "started": "inflight",
        "waiting": "waiting",
        "done": "terminal",
        "failed": "terminal",
        "aborted": "terminal",
    }
    transitions = {
        "pending": ["started", "waiting", "done", "failed", "aborted"],
        "started": ["waiting", "done", "failed", "aborted"],
        "waiting": ["pending", "done", "failed", "aborted"],
    }

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.on_execute: Handler = lambda task, ctx: settle(ctx, "done")
        self.on_recover: Handler = lambda task, ctx: settle(ctx, "done")
        self.on_abort: Handler = lambda task, ctx: settle(ctx, "aborted")

    def validate_state(self, value: JsonValue) -> JsonValue:
        return value

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("execute", task.id))
        await self.on_execute(task, ctx)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("recover", task.id))
        await self.on_recover(task, ctx)

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        self.calls.append(("abort", task.id))
        await self.on_abort(task, ctx)
