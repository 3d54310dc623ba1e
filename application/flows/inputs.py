"""Inputs and queues (§8.1, §8.2): acceptance while busy, the per-mode queues, placement at
a boundary, cancellation, and the input results a caller reads.

Not a task definition: a busy conversation enqueues an input (an unselected admission
entry, one sticky value in ``pico.queue.<mode>``, result ``queued``); the generation and
the join place queued inputs at their boundaries. Results live in core-owned session
values (``pico.input-result``): queued | running | done(entry) | placed(entry) |
cancelled | failed | stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pico.application.command import Command
from pico.application.ports import ReadPort
from pico.application.state import ConversationValue, SessionValue
from pico.domain.json import JsonObject, JsonValue

__all__ = [
    "MODES",
    "TRIGGERS",
    "InputResult",
    "cancel_every_queued_input",
    "cancel_queued_inputs",
    "enqueue",
    "input_result_address",
    "place",
    "queue_address",
    "queued",
    "set_results",
]


RESULT_NAMESPACE = "pico.input-result"


@lru_cache(maxsize=256)
def input_result_address(input_id: int) -> SessionValue[Any]:
    # Fixed-width keys keep numeric admission order in bounded key scans (§8.1). One
    # (immutable) address per input: a turn asks for its input's about ten times.
    return SessionValue(namespace=RESULT_NAMESPACE, key=f"{input_id:016d}")


@dataclass(frozen=True)
class InputResult:
    """§8.1: queued | running | done(entry) | placed(entry) | cancelled | failed | stopped."""

    status: str
    entry_id: int | None = None
    reason: str | None = None


MODES = ("write", "steer", "follow_up", "next_run")
TRIGGERS = ("steer", "follow_up", "next_run")  # modes that request generation


#: Queue values live in namespaces ``pico.queue.<mode>``: contiguous in a key scan.
_QUEUE = "pico.queue."


def queue_address(mode: str, input_id: int) -> ConversationValue[Any]:
    # One sticky value per queued input; fixed-width keys keep admission order in key scans.
    return ConversationValue(
        namespace=f"{_QUEUE}{mode}", key=f"{input_id:016d}", rewind_policy=False
    )


def enqueue(tx: Command, conversation_id: int, mode: str, content: JsonValue) -> int:
    """Busy acceptance: an unselected admission entry, a queue value, result queued."""
    entry = tx.append_entry(conversation_id, "user", content, metadata={"queued": mode})
    with tx.core():
        tx.set_value(queue_address(mode, entry), {"mode": mode}, conversation_id=conversation_id)
    set_results(tx, [entry], {"status": "queued"})
    return entry


def queued(tx: Command, conversation_id: int, modes: Sequence[str]) -> list[tuple[int, str]]:
    """(input id, mode) of queued inputs in the given modes, in admission order: the
    values under the contiguous ``pico.queue.*`` namespaces of the conversation (one seek;
    the session's owner keeps them, so a placement check reads nothing)."""
    wanted = set(modes)
    found: list[tuple[int, str]] = []
    for namespace, key, _, _ in tx.values_under(conversation_id, _QUEUE):
        mode = namespace[len(_QUEUE) :]
        if mode in wanted:
            found.append((int(key or 0), mode))
    return sorted(found)


def place(
    tx: Command, conversation_id: int, modes: Sequence[str], *, selection: str = "all"
) -> list[int]:
    """Place queued inputs of ``modes`` (all, or the oldest of each mode): a placement entry
    refers to the admission entry (never a copy) and is selected; the queue value is
    deleted. Writes resolve ``placed``; triggers are returned, now ``running``."""
    items = queued(tx, conversation_id, modes)
    if selection == "one":
        seen: set[str] = set()
        items = [(i, m) for i, m in items if not (m in seen or seen.add(m))]  # type: ignore[func-returns-value]
    triggers: list[int] = []
    for input_id, mode in items:  # admission order is preserved
        placement = tx.append_entry(conversation_id, "placement", {"input": input_id})
        tx.append_context(conversation_id, [placement])
        with tx.core():
            tx.delete_value(queue_address(mode, input_id), conversation_id=conversation_id)
        if mode == "write":
            set_results(tx, [input_id], {"status": "placed", "entry_id": placement})
        else:
            set_results(tx, [input_id], {"status": "running"})
            triggers.append(input_id)
    return triggers


def cancel_queued_inputs(
    tx: Command,
    conversation_id: int,
    modes: Sequence[str],
    *,
    reason: str = "aborted",
    deleted: bool = False,
) -> list[int]:
    """Cancel the queued inputs of ``modes`` in one conversation: dequeue each and record
    ``cancelled`` with ``reason``. Admission entries stay in the transcript (§8.1). A
    deleted conversation accepts no writes: only the results are recorded there."""
    items = queued(tx, conversation_id, modes)
    if not deleted:
        with tx.core():
            for input_id, mode in items:
                tx.delete_value(queue_address(mode, input_id), conversation_id=conversation_id)
    cancelled = [input_id for input_id, _ in items]
    if cancelled:
        set_results(tx, cancelled, {"status": "cancelled", "reason": reason})
    return cancelled


def cancel_every_queued_input(tx: Command, reads: ReadPort, *, reason: str) -> list[int]:
    """Cancel every queued input of every mode in every conversation of the session (§6.6
    shutdown). Conversations are enumerated in id pages (no index spans the queue
    namespaces of all conversations), each queue read as ``queued()`` reads it: a seek to
    its ``pico.queue.*`` namespaces, never a scan of history. Run inside the builder, so
    every read shares the command's snapshot."""
    cancelled: list[int] = []
    after: int | None = None
    while True:
        page = reads.scan_conversations(after=after, limit=MAX_CONVERSATION_PAGE)
        for conv in page.items:
            cancelled += cancel_queued_inputs(
                tx, conv.id, MODES, reason=reason, deleted=conv.deleted
            )
        if page.next is None:
            return cancelled
        after = page.next


#: Conversations read per page when shutdown enumerates the session's queues.
MAX_CONVERSATION_PAGE = 1000


def set_results(tx: Command, inputs: Sequence[int], result: JsonObject) -> None:
    with tx.core():  # results live in core-owned session values
        for input_id in inputs:
            address = input_result_address(input_id)
            tx.made_here(address, input_id)  # an input this command accepted: a new key
            tx.set_value(address, result)
