"""The child side of ownership (§5.7, §8.6): a child conversation's terminal foreground
boundary settles its subagent owner in the boundary's own command.

Imported by the flows whose commands end an input group: a generation's answer, failure
or interrupted answer, the join's stop, and the cancellation of either. The owner's
definition lives in ``subagent.py``.
"""

from __future__ import annotations

from pico.application.command import Command
from pico.application.flows.common import ints, task_state
from pico.application.flows.inputs import set_results
from pico.domain.json import JsonObject, JsonValue
from pico.domain.values import TaskSnapshot

__all__ = ["OWNER_STATUS", "cancel_input_group", "owner_status", "settle_owner"]

#: The owner's terminal status for each child outcome.
OWNER_STATUS = {
    "done": "done",
    "interrupted": "done",
    "failed": "failed",
    "stopped": "stopped",
    "cancelled": "aborted",
}


def settle_owner(tx: Command, conversation_id: int, result: JsonObject) -> None:
    """At a child's terminal foreground boundary: settle its live subagent owner with the
    result reference, in the boundary's own command. Not an owned child, an owner already
    settled, or an owner marked for cancellation (its abort handler settles it, never with
    success, §6.5): nothing to do."""
    owner_id = tx.owner_of(conversation_id)
    if owner_id is None:
        return
    owner = tx.get_task(owner_id)
    if owner is None or owner.kind != "subagent" or not owner.live:
        return
    if tx.abort_marked(owner_id):
        return  # cancellation owns the outcome
    tx.patch_task(
        owner_id, status=owner_status(result), state={**task_state(owner), "result": result}
    )


def owner_status(result: JsonValue) -> str:
    """The owner status for a stored child result (``done`` | ``failed`` | ``stopped``)."""
    status = result.get("status") if isinstance(result, dict) else None
    return OWNER_STATUS.get(str(status), "failed")


def cancel_input_group(tx: Command, task: TaskSnapshot) -> None:
    """The abort of a task that carries an input group (a generation, a join): its inputs
    end ``cancelled``, an owner nobody marked learns it (a marked one is settled by its
    own abort handler), and the task is ``aborted``."""
    cancelled: JsonObject = {"status": "cancelled", "reason": "aborted"}
    set_results(tx, ints(task_state(task).get("inputs")), cancelled)
    settle_owner(tx, task.conversation_id, cancelled)
    tx.patch_task(task.id, status="aborted")
