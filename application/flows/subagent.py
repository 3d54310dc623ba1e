"""Subagents (§4.3, §5.5-§5.7, §8.6): the owner task S of a child conversation.

    status      role        transitions
    waiting     waiting     -> done | failed | stopped | aborted
    done, failed, stopped, aborted   terminal

``launch`` builds, inside the caller's ONE command: S (``waiting``), the child conversation
owned by S (both links commit together), its initial values (the selected present values of
the parent copied, then the overrides; nothing else, no fallback), its starting context
(fresh, or the parent's last complete-exchange prefix), the prompt appended and selected
with its input result ``running``, and the child's first generation. No effect starts
before that command is durable, and S never executes: it waits.

The child's terminal foreground boundary settles S in the SAME command (``settle_owner``):
the input group resolved with nothing more to run (an answer with no queued follow-up, a
failure, a stop) records the result reference in S's state, ``{"status": "done",
"entry_id": answer}`` or ``{"status": "failed" | "stopped", "reason": ...}``. A marked S is
never settled by its child: once the child's selected work is terminal (the scheduler waits
for that, §6.5), S's abort handler settles it ``aborted`` with ``{"status": "cancelled"}``.

Direct ``spawn`` is detached background work (§5.6); a foreground delegation (a tool
returning ``ToolDelegation``) creates S as foreground and makes the tool wait on it.
Recovery drives the child's existing tasks; it never recreates the child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pico.application.command import Command
from pico.application.flows.common import AgentServices, closed_exchanges, task_state
from pico.application.flows.generation import generation_state
from pico.application.flows.inputs import input_result_address, set_results
from pico.application.flows.owner import OWNER_STATUS, owner_status
from pico.application.state import Initialization
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.application.tools import CHILD_CONTEXTS, Tool, ToolContext, ToolDelegation, tool_names
from pico.domain.errors import InvalidArgumentError, TaskDefinitionError
from pico.domain.ids import check_choice
from pico.domain.json import JsonObject, JsonValue, check_json
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = [
    "CONTEXTS",
    "SubagentDefinition",
    "complete_prefix",
    "launch",
    "offered_tools",
    "subagent_tool",
]

#: How a child conversation's context starts.
CONTEXTS = CHILD_CONTEXTS


class SubagentDefinition(TaskDefinition):
    kind = "subagent"
    initial_status = "waiting"
    roles: dict[str, Role] = {
        "waiting": "waiting",  # the child conversation runs; its boundary settles S
        "done": "terminal",
        "failed": "terminal",
        "stopped": "terminal",
        "aborted": "terminal",
    }
    transitions = {"waiting": ["done", "failed", "stopped", "aborted"]}

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        # No status of S is ready: the scheduler never executes it.
        raise TaskDefinitionError(f"subagent task {task.id} waits for its child; it never runs")

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Nothing to re-arm: the child's own tasks settle S. A child that has no live work
        left while S still waits (its boundary was stored without the owner settlement,
        e.g. by an older release) is repaired from its prompt's recorded result — never by
        recreating the child or running anything."""
        await ctx.command(lambda tx: _repair(tx, task.id))

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)

        def cancel(tx: Command) -> None:
            result: JsonObject = {"status": "cancelled", "reason": "aborted"}
            tx.patch_task(task.id, status="aborted", state={**state, "result": result})

        await ctx.command(cancel)


def launch(
    tx: Command,
    services: AgentServices,
    conversation_id: int,
    prompt: JsonValue,
    *,
    context: str = "fresh",
    values: Initialization | Sequence[Any] | None = None,
    tools: Sequence[str] | None = None,
    foreground: bool = False,
    spawned_by: int | None = None,
) -> int:
    """Create S and its whole child in the caller's command (see the module docstring);
    returns S. Every argument is checked before anything is written."""
    check_json(prompt, what="subagent prompt")
    check_choice(context, "context", CONTEXTS)
    init = Initialization() if values is None else Initialization.of(values)
    offered = offered_tools(services, tools)
    selected = complete_prefix(tx, _context(tx, conversation_id)) if context == "inherit" else []
    owner = tx.create_task(
        conversation_id,
        "subagent",
        foreground=foreground,
        spawned_by=spawned_by,
        state={"context": context, "tools": list[JsonValue](offered)},
    )
    child = tx.create_owned_conversation(owner, context=selected, values=init)
    entry = tx.append_entry(child, "user", prompt, by_task_id=owner)
    tx.append_context(child, [entry])
    set_results(tx, [entry], {"status": "running"})
    tx.create_task(
        child,
        "generation",
        foreground=True,
        spawned_by=owner,
        state=generation_state(services, [entry], offered),
    )
    # The prompt's id is known only now: S's record names it (its result is the child's).
    tx.patch_task(
        owner, state={"context": context, "tools": list[JsonValue](offered), "prompt": entry}
    )
    return owner


def offered_tools(
    services: AgentServices, tools: Sequence[str] | None, *, without: str | None = None
) -> list[str]:
    """The tools a child is offered: ``tools`` checked against the registry, or by
    default the tools a new input is offered (``without`` the delegating tool)."""
    registered = services.tools.names()
    if tools is None:
        default = list(services.active_tools) if services.active_tools is not None else registered
        return [t for t in default if t != without]
    names = tool_names(tools, "tools")
    unknown = [t for t in names if t not in registered]
    if unknown:
        raise InvalidArgumentError(
            f"tools {unknown} are not registered (registered: {sorted(registered)}); pass "
            "them to Harness.open(tools=...) or offer only registered tools"
        )
    return list(dict.fromkeys(names))


def _context(tx: Command, conversation_id: int) -> tuple[int, ...]:
    snapshot = tx.get_conversation(conversation_id)
    return () if snapshot is None else tuple(snapshot.context)


def complete_prefix(tx: Command, context: Sequence[int]) -> list[int]:
    """The longest prefix of ``context`` at which no tool call is open: the last
    complete-exchange boundary, so a launching exchange's unresolved calls (a delegation's
    own call, say) are never inherited (§8.6)."""
    if not context:
        return []
    closed = closed_exchanges(tx.get_entries(list(context), content=False), context)
    cut = max((i + 1 for i, done in enumerate(closed) if done), default=0)
    return list(context[:cut])


def _repair(tx: Command, owner_id: int) -> None:
    owner = tx.get_task(owner_id)
    if owner is None or not owner.live or owner.abort_requested:
        return
    state = task_state(owner)
    child = owner.owned_conversation_id
    if child is not None and tx.scan_tasks(conversation_ids=[child], live=True, limit=1).items:
        return  # the child is still working: its boundary will settle S
    prompt = state.get("prompt")
    stored = tx.get_value(input_result_address(prompt)) if isinstance(prompt, int) else None
    result: JsonObject = dict(stored) if isinstance(stored, dict) else {}
    if result.get("status") not in OWNER_STATUS:
        result = {
            "status": "failed",
            "reason": "the child conversation has no live work and no outcome for its prompt",
        }
    tx.patch_task(owner_id, status=owner_status(result), state={**state, "result": result})


def subagent_tool(
    *,
    name: str = "subagent",
    description: str = (
        "Delegate a self-contained task to a subagent: a separate conversation that works "
        "on the prompt with its own tools and returns its final answer as this call's result."
    ),
    context: str = "fresh",
    background: bool = False,
    tools: Sequence[str] | None = None,
    values: Initialization | None = None,
) -> Tool:
    """The ready ``subagent`` tool (§9.3): offer it and a model can delegate. The model
    gives ``prompt`` and may choose ``context`` (fresh | inherit) and ``background``; the
    defaults here apply otherwise. ``tools`` is what the child is offered (default: the
    tools a new input is offered, without this tool), ``values`` the child's initial
    values. Foreground (the default): the call's result is the child's final answer text
    (an error result if the child failed or was cancelled). Background: the call's result
    names the subagent task at once and the exchange goes on."""
    check_choice(context, "context", CONTEXTS)
    if type(background) is not bool:
        raise InvalidArgumentError(f"background must be True or False, got {background!r}")
    init = None if values is None else Initialization.of(values)
    child_tools = None if tools is None else tool_names(tools, "subagent_tool(tools=...)")
    parameters: JsonObject = {
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "The task for the subagent, in full."},
            "context": {
                "type": "string",
                "enum": list[JsonValue](CONTEXTS),
                "description": "fresh: the subagent sees only the prompt; inherit: it also "
                "sees this conversation so far.",
            },
            "background": {
                "type": "boolean",
                "description": "true: return at once and let the subagent work on; false: "
                "wait for its answer.",
            },
        },
        "required": ["prompt"],
        "additionalProperties": False,
    }

    async def execute(args: JsonObject, ctx: ToolContext) -> ToolDelegation:
        # The schema has checked the arguments' types before this runs.
        chosen_context = args.get("context", context)
        chosen_background = args.get("background", background)
        return ToolDelegation(
            prompt=args["prompt"],
            background=chosen_background is True,
            context=str(chosen_context),
            values=init,
            tools=child_tools,
        )

    return Tool(name, description, parameters, execute)
