"""How a stored or just-committed domain event reads to an auditor or a watcher: the name
of its stream and its fields. Pure functions of the event object, shared by the audit
reader (infrastructure) and in-process watch delivery (``watch.py``)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from datetime import datetime
from typing import Any

__all__ = ["aggregate_name", "event_payload"]


def aggregate_name(event: Any) -> str:
    """The auditor's name of the stream an event belongs to."""
    owner = type(event).__qualname__.split(".", 1)[0]
    if owner == "Conversation":
        return f"conversation/{event.conversation_id}"
    if owner == "Task":
        return f"task/{event.task_id}"
    return "session"


def event_payload(event: Any) -> dict[str, Any]:
    """An event's fields as an auditor reads them (its stream id, version and time are
    the record's own)."""
    names = [f.name for f in fields(event)] if is_dataclass(event) else list(vars(event))
    skip = {"originator_id", "originator_version", "timestamp"}
    out: dict[str, Any] = {}
    for name in names:
        if name in skip:
            continue
        value = getattr(event, name)
        out[name] = value.isoformat() if isinstance(value, datetime) else value
    return out
