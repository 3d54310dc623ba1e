"""Approvals as durable tasks (§8.6, §6.4, seed 000 "the approval channel").

    status      role        transitions
    pending     waiting     -> granted | denied | aborted   (a person decides)
    granted, denied, aborted            terminal

A call held by ``before_tool`` creates one approval task A and waits on it in ONE command
(``hold``); a decision settles A and moves its tool in ONE command (``decide``): grant makes
the tool ready with the approved arguments, deny makes it ``finishing`` with the denial.
A runs no effect and its recovery decides nothing: the record is the decision surface.
"""

from __future__ import annotations

from pico.application.command import Command
from pico.application.flows.common import task_state
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.errors import CommandRejectedError, UnknownTaskError
from pico.domain.ids import check_choice, check_id
from pico.domain.json import JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = [
    "AWAITING_APPROVAL",
    "DECISIONS",
    "LEGACY_APPROVAL",
    "ApprovalDefinition",
    "decide",
    "hold",
    "migrate",
]

#: The decisions a person can make.
DECISIONS = ("grant", "deny")
#: The tool's status while it waits on its approval task (``after:[A]``).
AWAITING_APPROVAL = "awaiting_approval"
#: The tool's status in sessions stored before approvals were tasks: held with no task A.
LEGACY_APPROVAL = "approval"
#: What a denied call's result says (the tool's ``finishing`` phase writes it).
DENIED = "denied by approval"
CANCELLED = "the approval was cancelled before a decision"


class ApprovalDefinition(TaskDefinition):
    kind = "approval"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "waiting",
        "granted": "terminal",
        "denied": "terminal",
        "aborted": "terminal",
    }
    transitions = {"pending": ["granted", "denied", "aborted"]}

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Never ready: an approval only waits for a decision."""

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        """Nothing to arm and never a decision: a pending approval stays pending and
        listable after a restart (the drive reports ``suspended``)."""

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        await ctx.command(lambda tx: _abort(tx, task.id))


def _abort(tx: Command, approval_id: int) -> None:
    """``{ A aborted }``. A tool marked too writes its own aborted result; an unmarked tool
    still waiting on A (only A was cancelled) finishes with the cancellation as a denial,
    so it never waits on a settled approval."""
    approval = tx.get_task(approval_id)
    if approval is None or not approval.live:
        return
    tx.patch_task(approval_id, status="aborted")
    tool = _waiting_tool(tx, approval)
    if tool is not None and not tx.abort_marked(tool.id):
        _deny(tx, tool, CANCELLED)


def hold(tx: Command, tool: TaskSnapshot, arguments: JsonValue, reason: str = "") -> int | None:
    """``{ create approval A; tool waiting after:[A] }``: A is required work of the
    exchange (foreground), spawned by the tool, holding the call and the arguments to
    approve. Returns A's id; None (nothing written) once the tool is marked for
    cancellation, whose abort then writes its result."""
    if tx.abort_marked(tool.id):
        return None
    state = task_state(tool)
    approval = tx.create_task(
        tool.conversation_id,
        "approval",
        state={
            "tool_task": tool.id,
            "call_id": state.get("call_id"),
            "name": state.get("name"),
            "arguments": arguments,
            "reason": reason,
        },
        foreground=True,
        spawned_by=tool.id,
    )
    tx.patch_task(
        tool.id,
        status=AWAITING_APPROVAL,
        after=[*tool.after, approval],
        state={**state, "approval": approval},
    )
    return approval


def migrate(tx: Command, tool_id: int) -> int | None:
    """A tool stored live in the legacy status ``approval`` (held with no approval task)
    gets its A in ONE command, exactly as a new hold; it is never granted. Returns A's id,
    or None when the tool was decided, settled or marked meanwhile."""
    tool = tx.get_task(tool_id)
    if tool is None or not tool.live or tool.status != LEGACY_APPROVAL:
        return None
    return hold(tx, tool, task_state(tool).get("arguments"))


def decide(tx: Command, task_id: int, decision: str) -> int:
    """Validate, then decide in ONE command; returns the approval task's id.

    ``task_id`` is the approval task A, or (for compatibility) its held tool call, mapped to
    the tool's live A; a legacy tool held in status ``approval`` with no A gets its A created
    and decided in the same command. Refused, writing nothing: an unknown id, a task that is
    not an approval, an approval decided already (its decision is named), and an approval
    or tool marked for cancellation (grant/deny versus abort is serialized by the line)."""
    check_choice(decision, "an approval decision", DECISIONS)
    check_id(task_id, "task_id")
    task = tx.get_task(task_id)
    if task is None:
        raise UnknownTaskError(task_id, "; list the pending ones with harness.pending_approvals()")
    if task.kind == "tool":
        approval = _approval_of(tx, task)
        if approval is None:  # a legacy hold, not migrated yet: migrate and decide at once
            _check_decidable(tx, task, None)
            approval_id = hold(tx, task, task_state(task).get("arguments"))
            assert approval_id is not None  # an unmarked tool: _check_decidable refused a mark
            _settle(tx, approval_id, task_state(task).get("arguments"), task, decision)
            return approval_id
        task = approval
    elif task.kind != "approval":
        raise CommandRejectedError(
            f"task {task_id} is a {task.kind!r} task, not an approval; pass an approval task "
            "id (harness.pending_approvals()) or the id of its held tool call"
        )
    tool = _waiting_tool(tx, task)
    _check_decidable(tx, tool, task)
    assert tool is not None  # _check_decidable refuses an approval without a waiting tool
    _settle(tx, task.id, task_state(task).get("arguments"), tool, decision)
    return task.id


def _approval_of(tx: Command, tool: TaskSnapshot) -> TaskSnapshot | None:
    """The approval task a tool call waits on (or waited on); None for a legacy hold."""
    approval_id = task_state(tool).get("approval")
    if isinstance(approval_id, int) and not isinstance(approval_id, bool):
        found = tx.get_task(approval_id)
        if found is not None and found.kind == "approval":
            return found
    if tool.live and tool.status == LEGACY_APPROVAL:
        return None
    raise CommandRejectedError(
        f"tool task {tool.id} is {tool.status!r} and has no approval to decide; only a call "
        "held by before_tool waits for a decision"
    )


def _waiting_tool(tx: Command, approval: TaskSnapshot) -> TaskSnapshot | None:
    """The live tool call waiting on this approval, if any."""
    tool_id = task_state(approval).get("tool_task")
    tool = tx.get_task(tool_id) if isinstance(tool_id, int) and tool_id > 0 else None
    if tool is None or not tool.live or tool.status != AWAITING_APPROVAL:
        return None
    return tool if approval.id in tool.after else None


def _check_decidable(tx: Command, tool: TaskSnapshot | None, approval: TaskSnapshot | None) -> None:
    if approval is not None and not approval.live:
        raise CommandRejectedError(
            f"approval {approval.id} was already {approval.status}; a late decision cannot "
            "restart settled work"
        )
    for marked in (approval, tool):
        if marked is not None and tx.abort_marked(marked.id):
            what = "approval" if marked.kind == "approval" else "its tool call"
            raise CommandRejectedError(
                f"approval of tool call {_tool_id(tool, approval)} is refused: {what} (task "
                f"{marked.id}) is marked for cancellation; the cancellation settles it when the "
                "conversation is driven"
            )
    if tool is None:
        assert approval is not None
        raise CommandRejectedError(
            f"approval {approval.id} has no tool call waiting on it; nothing to decide"
        )


def _tool_id(tool: TaskSnapshot | None, approval: TaskSnapshot | None) -> JsonValue:
    if tool is not None:
        return tool.id
    return None if approval is None else task_state(approval).get("tool_task")


def _settle(
    tx: Command, approval_id: int, arguments: JsonValue, tool: TaskSnapshot, decision: str
) -> None:
    """Grant: ``{ A granted; tool ready with the approved arguments }`` (it runs without
    asking before_tool again). Deny: ``{ A denied; tool finishing with the denial }``."""
    if decision == "grant":
        tx.patch_task(approval_id, status="granted")
        state = {**task_state(tool), "approval": approval_id}
        tx.patch_task(
            tool.id, status="pending", state={**state, "approved": True, "arguments": arguments}
        )
        return
    tx.patch_task(approval_id, status="denied")
    _deny(tx, tool, DENIED, approval_id)


def _deny(tx: Command, tool: TaskSnapshot, reason: str, approval_id: int | None = None) -> None:
    state = task_state(tool)
    if approval_id is not None:
        state["approval"] = approval_id
    tx.patch_task(
        tool.id,
        status="finishing",
        state={**state, "approved": False, "finish": {"denied": reason}},
    )
