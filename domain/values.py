"""Read snapshots returned to callers. Immutable; payloads are fresh copies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from pico.domain.json import JsonValue

__all__ = [
    "CommitBoundary",
    "ConversationSnapshot",
    "Entry",
    "ListElement",
    "Order",
    "Page",
    "SessionMeta",
    "Source",
    "StoredValue",
    "TaskSnapshot",
    "ValueItem",
    "ValuePage",
]

T = TypeVar("T")
Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class Source:
    """Where a historical fork came from: conversation and main boundary."""

    conversation_id: int
    as_of: int


@dataclass(frozen=True)
class ConversationSnapshot:
    id: int
    context: tuple[int, ...]
    source: Source | None
    inherit_state: bool
    prefix_revision: int
    owner_task_id: int | None
    created_seq: int
    deleted: bool = False


@dataclass(frozen=True)
class Entry:
    """An entry, or its header when ``content`` was not requested (``has_content`` False)."""

    id: int
    conversation_id: int
    kind: str
    commit_end: int
    content: JsonValue = None
    metadata: dict[str, JsonValue] | None = None
    key: str | None = None
    by_task_id: int | None = None
    has_content: bool = True


@dataclass(frozen=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    as_of: int
    next: int | None = None


@dataclass(frozen=True)
class TaskSnapshot:
    """A task record as stored (§5.1, §6.1); ``state`` is a fresh copy."""

    id: int
    conversation_id: int
    kind: str
    status: str
    role: str
    state: JsonValue
    after: tuple[int, ...]
    foreground: bool
    spawned_by: int | None
    owned_conversation_id: int | None
    not_before: float | None
    required_permit: str | None
    abort_requested: bool
    updated_seq: int

    @property
    def live(self) -> bool:
        return self.role != "terminal"


@dataclass(frozen=True)
class StoredValue(Generic[T]):
    """A present value and the sequence number of the write that set it."""

    seq: int
    value: T


@dataclass(frozen=True)
class ListElement(Generic[T]):
    """A list element; its id is the sequence number of its append (the list cursor)."""

    id: int
    value: T


@dataclass(frozen=True)
class ValueItem:
    namespace: str
    key: str | None
    seq: int
    value: JsonValue


@dataclass(frozen=True)
class ValuePage:
    """A ``scan_values`` page; ``next`` is an address key cursor (namespace, key)."""

    items: tuple[ValueItem, ...]
    as_of: int
    next: tuple[str, str] | None = None


@dataclass(frozen=True)
class CommitBoundary:
    first: int
    last: int
    scope: str = "main"


@dataclass(frozen=True)
class SessionMeta:
    session_id: str
    head: int
    main_head: int
    root_id: int | None
    owner: str | None
    extra: dict[str, JsonValue] = field(default_factory=dict)
