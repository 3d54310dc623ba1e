"""Commands for a session whose owner is another process (issue 16, docs/workers.md).

Under the one-writer rule (seed 003 §1.2) an API process that does not own a session
never writes its events. It submits a command to the session's **inbox** (a row in
``pico_inbox``, keyed by a request key unique within the session); the worker that owns
the session executes it in its own serialized command and records the reply on the row.

This module is the engine-independent part: which commands an inbox carries, how a
submission is validated before anything is stored (``check``), how the owner executes
one (``execute``: idempotent by the request key, so a retry after a crash between the
command's commit and the reply's never applies it twice), and how a reply travels
(``reply_json`` / ``raise_or_value``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pico.application.flows.approval import DECISIONS, decide
from pico.application.flows.tool import answer_held_call
from pico.domain import errors
from pico.domain.errors import (
    CommandRejectedError,
    InvalidArgumentError,
    PicoError,
)
from pico.domain.ids import check_choice, check_id
from pico.domain.json import JsonValue, check_json, dumps, loads

if TYPE_CHECKING:
    from pico.application.command import Command
    from pico.application.harness import Harness

__all__ = [
    "INPUT_KINDS",
    "KINDS",
    "InboxItem",
    "check",
    "execute",
    "is_verdict",
    "raise_or_value",
    "reply_json",
]

#: Input modes (§8.2): the conversation handle's method of the same name.
INPUT_KINDS = ("accept", "steer", "follow_up", "next_run", "append_message")
#: Every command an inbox carries.
KINDS = (*INPUT_KINDS, "decide_approval", "answer_tool_call")

_MODE = {
    "accept": "follow_up",
    "steer": "steer",
    "follow_up": "follow_up",
    "next_run": "next_run",
    "append_message": "write",
}

#: The conversation a session-level command's request key is recorded under.
SESSION_KEYS = 0


@dataclass(frozen=True)
class InboxItem:
    """One submitted command, as the owner reads it."""

    id: int
    session_id: str
    request_key: str
    kind: str
    payload: dict[str, Any]


def check(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The submission's payload, validated before anything is stored; raises
    ``InvalidArgumentError`` / ``InvalidJsonError`` naming what is wrong."""
    check_choice(kind, "an inbox command", KINDS)
    if kind in INPUT_KINDS:
        conversation = payload.get("conversation_id")
        if conversation is not None:
            check_id(conversation, "conversation_id")
        check_json(payload.get("input"), what="input")
        return {"conversation_id": conversation, "input": payload.get("input")}
    check_id(payload.get("task_id"), "task_id")
    if kind == "decide_approval":
        check_choice(payload.get("decision"), "an approval decision", DECISIONS)
        return {"task_id": payload["task_id"], "decision": payload["decision"]}
    content, is_error = payload.get("content"), payload.get("is_error", False)
    if not isinstance(content, str):
        raise InvalidArgumentError("a tool answer is text (put structure in JSON text)")
    check_json(content, what="tool answer")
    if type(is_error) is not bool:
        raise InvalidArgumentError(f"is_error must be True or False, got {is_error!r}")
    return {"task_id": payload["task_id"], "content": content, "is_error": is_error}


async def execute(harness: Harness, item: InboxItem) -> JsonValue:
    """Execute one inbox command on the owner's harness, keyed by its request key: the
    first execution records the key with the command; a second (after a crash before the
    reply was stored) finds it and returns the original id without writing anything."""
    payload, key = item.payload, item.request_key
    if item.kind in INPUT_KINDS:
        conversation_id = payload.get("conversation_id")
        if conversation_id is None:
            conversation = await harness.root()
        else:
            found = await harness.conversation(int(conversation_id))
            if found is None:
                raise errors.UnknownConversationError(int(conversation_id))
            conversation = found
        return await conversation._admit(payload["input"], _MODE[item.kind], key)
    fingerprint = dumps({"kind": item.kind, **payload}, what="inbox command")
    task_id = payload["task_id"]

    def build(tx: Command) -> int:
        def create() -> int:
            if item.kind == "decide_approval":
                return decide(tx, task_id, payload["decision"])
            return answer_held_call(tx, task_id, payload["content"], payload["is_error"])

        return tx.claim_request_key(
            key, conversation_id=SESSION_KEYS, fingerprint=fingerprint, create=create
        )[0]

    result: int = await harness.command(build)
    return result


def is_verdict(exc: BaseException) -> bool:
    """Is this error the command's own answer (stored as its reply), rather than the
    owner's trouble (a fenced writer, a faulted handle, storage down: the command stays
    in the inbox for the next owner)?"""
    return isinstance(exc, CommandRejectedError)


def reply_json(value: JsonValue = None, error: BaseException | None = None) -> str:
    """The reply stored on the inbox row."""
    if error is None:
        return dumps({"ok": True, "value": value})
    return dumps({"ok": False, "error": type(error).__name__, "message": str(error)})


def raise_or_value(text: str) -> JsonValue:
    """The value of a stored reply, or its error raised again (the same ``PicoError``
    class, carrying the owner's message)."""
    reply = loads(text)
    if not isinstance(reply, dict):
        raise errors.StorageCorruptError(f"an inbox reply is not an object: {text[:200]!r}")
    if reply.get("ok") is True:
        return reply.get("value")
    name, message = str(reply.get("error")), str(reply.get("message"))
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, PicoError)):
        cls = _error_class(name) or CommandRejectedError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    raise exc


def _error_class(name: str) -> type[PicoError] | None:
    """A ``PicoError`` subclass defined outside ``domain/errors.py`` (e.g. the tool
    flow's ``ToolCallAnsweredError``), found by its name among the loaded subclasses."""
    pending: list[type[PicoError]] = [PicoError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending.extend(cls.__subclasses__())
    return None
