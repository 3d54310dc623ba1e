"""The join after one assistant entry's tool calls (§8.4): the ``post_tools`` task.

    status      role        transitions
    pending     ready       -> done | aborted
    done, aborted           terminal

It waits on every tool task of the entry (``after``) and decides in ONE command: a tool
that terminated stops the input group; a single handoff resets the context to it; safe
writes and steering are placed (the tool boundary, §8.2); the next generation is created
with the active-tool additions of this exchange.
"""

from __future__ import annotations

from pico.application.command import Command
from pico.application.flows.common import AgentServices, ints, names, task_state
from pico.application.flows.generation import generation_state
from pico.application.flows.inputs import place, set_results
from pico.application.flows.owner import cancel_input_group, settle_owner
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.json import JsonObject
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = ["PostToolsDefinition"]


class PostToolsDefinition(TaskDefinition):
    kind = "post_tools"
    initial_status = "pending"
    roles: dict[str, Role] = {"pending": "ready", "done": "terminal", "aborted": "terminal"}
    transitions = {"pending": ["done", "aborted"]}

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        inputs = ints(state.get("inputs"))

        def join(tx: Command) -> None:  # ONE command reads all outcomes and decides
            if tx.abort_marked(task.id) is not False:
                return
            found = tx.get_tasks(task.after)  # every tool outcome in one read
            tools = [found[i] for i in task.after if i in found]
            cid = task.conversation_id
            if any(isinstance(t.state, dict) and t.state.get("terminate") for t in tools):
                stopped: JsonObject = {"status": "stopped", "reason": "a tool terminated"}
                set_results(tx, inputs, stopped)
                settle_owner(tx, cid, stopped)
            else:
                handoffs = [
                    t.state.get("handoff")
                    for t in tools
                    if isinstance(t.state, dict) and t.state.get("handoff") is not None
                ]
                if len(handoffs) == 1:  # conflicting handoffs reject the handoff
                    entry = tx.append_entry(cid, "handoff", handoffs[0], by_task_id=task.id)
                    tx.reset_context(cid, [entry])
                # The tool boundary: safe writes and steering join the current input group.
                steering = place(
                    tx, cid, ("write", "steer"), selection=self.services.queue_selection
                )
                offered_next = names(state.get("tools"))
                for t in tools:  # active-tool additions from this exchange
                    added = t.state.get("add_tools") if isinstance(t.state, dict) else None
                    for name in added if isinstance(added, list) else []:
                        if isinstance(name, str) and name not in offered_next:
                            offered_next.append(name)
                tx.create_task(
                    cid,
                    "generation",
                    foreground=True,
                    spawned_by=task.id,
                    state=generation_state(
                        self.services, [*inputs, *steering], offered_next, state
                    ),
                )
            tx.patch_task(task.id, status="done")

        await ctx.command(join, defer=True)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        await self.execute(task, ctx)

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        def cancel(tx: Command) -> None:
            cancel_input_group(tx, task)

        await ctx.command(cancel)
