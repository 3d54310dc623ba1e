"""Identity: one session-global sequence; aggregate UUIDs derived from it."""

from __future__ import annotations

from uuid import NAMESPACE_URL, UUID, uuid5

__all__ = ["MAX_SEQ", "conversation_uuid", "session_uuid", "task_uuid"]

#: Ids are positive safe integers (§3.1); allocating past this rejects.
MAX_SEQ = 2**53 - 1

_NS = uuid5(NAMESPACE_URL, "pico:aggregate")


def session_uuid(session_id: str) -> UUID:
    return uuid5(_NS, f"session/{session_id}")


def conversation_uuid(session_id: str, conversation_id: int) -> UUID:
    return uuid5(_NS, f"session/{session_id}/conversation/{conversation_id}")


def task_uuid(session_id: str, task_id: int) -> UUID:
    return uuid5(_NS, f"session/{session_id}/task/{task_id}")
