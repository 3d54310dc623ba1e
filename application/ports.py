"""Ports: what the application needs from storage. Adapters live in infrastructure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from eventsourcing.domain import Aggregate

from pico.application.chain import ChainReport
from pico.domain.json import JsonValue
from pico.domain.state import StateWrite
from pico.domain.values import (
    ConversationSnapshot,
    Entry,
    Order,
    Page,
    SessionMeta,
    TaskSnapshot,
    ValuePage,
)

__all__ = ["AuditRecord", "ReadPort", "StatePort", "Storage", "StorageOpener", "TaskPort"]


class ReadPort(Protocol):
    """Committed-state queries of one session (§7.2, §7.3)."""

    def meta(self) -> SessionMeta | None: ...
    def main_head(self) -> int: ...
    def is_main_boundary(self, position: int) -> bool: ...
    def lineage(self, conversation_id: int) -> list[tuple[int, int]]: ...
    def owners(self, ids: Sequence[int]) -> dict[int, int | None]: ...
    def get_conversations(
        self, ids: Sequence[int], as_of: int | None = None
    ) -> dict[int, ConversationSnapshot]: ...
    def scan_conversations(
        self,
        *,
        source_conversation_id: int | None = None,
        owner_task_id: int | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[ConversationSnapshot]: ...
    def context_as_of(self, conversation_id: int, position: int) -> tuple[int, ...]: ...
    def context_tail(
        self, conversation_id: int, after_position: int | None = None
    ) -> tuple[int, list[tuple[int, int]]] | None: ...
    def get_entries(self, ids: Sequence[int], *, content: bool = True) -> dict[int, Entry]: ...
    def scan_entries(
        self,
        conversation_id: int,
        *,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        kind: str | None = None,
        key: str | None = None,
        as_of: int | None = None,
        content: bool = False,
    ) -> Page[Entry]: ...


class TaskPort(Protocol):
    """Current task records (§7.2)."""

    def get_tasks(self, ids: Sequence[int]) -> dict[int, TaskSnapshot]: ...
    def scan_tasks(
        self,
        *,
        conversation_ids: Sequence[int] | None = None,
        live: bool | None = None,
        role: str | None = None,
        kind: str | None = None,
        foreground: bool | None = None,
        abort_requested: bool | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[TaskSnapshot]: ...
    def live_tasks(self, *, state: bool = True) -> list[TaskSnapshot]: ...
    def owned_conversations(self, conversation_id: int) -> list[int]: ...


class StatePort(Protocol):
    """Committed scoped-state queries (§4.4): values as (seq, JSON text)."""

    def address_policy(
        self, scope_kind: str, kind: str, namespace: str, key: str
    ) -> bool | None: ...
    def get_value(
        self, scope: str, namespace: str, key: str, *, rewind: bool, as_of: int | None = None
    ) -> tuple[int, str] | None: ...
    def read_list(
        self,
        scope: str,
        namespace: str,
        key: str,
        *,
        rewind: bool,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        as_of: int | None = None,
    ) -> Page[tuple[int, str]]: ...
    def scan_values(
        self,
        scope: str,
        *,
        namespace: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> ValuePage: ...
    def values_under(self, scope: str, prefix: str) -> list[tuple[str, str, int, str]]: ...


@dataclass(frozen=True)
class AuditRecord:
    """One stored event, as an auditor reads it."""

    position: int  # storage order within the session
    aggregate: str  # "session" or "conversation/<id>"
    version: int
    event: str
    timestamp: datetime | None
    payload: dict[str, JsonValue]


class Storage(Protocol):
    """One session's storage: atomic saves of aggregates, loads, and committed reads.

    ``save`` persists all pending events of the given aggregates and their projected
    read-model rows in ONE transaction. It raises ``StaleWriterError`` when another owner
    claimed the session (nothing stored); any other exception means the outcome is unknown.

    With ``defer=True`` the transaction may stay open for the next save to join (group
    commit); the session's own reads see it at once, ``flush`` makes it durable, and a
    failure of any later save or flush leaves every deferred save uncertain too.
    """

    session_id: str
    reads: ReadPort
    state: StatePort
    tasks: TaskPort

    def snapshot(self) -> AbstractContextManager[object]:
        """One committed snapshot for every read inside (nested reads join it)."""
        ...

    def load(self, aggregate_id: UUID) -> Aggregate | None: ...
    def save(
        self,
        aggregates: Sequence[Aggregate],
        *,
        working: Sequence[StateWrite] = (),
        defer: bool = False,
    ) -> None: ...
    def flush(self) -> None: ...
    def audit(self, *, after: int = 0, limit: int = 1000) -> list[AuditRecord]: ...
    def count_events(self, *, after: int = 0) -> int: ...
    def last_position(self) -> int:
        """The position of the newest stored event (0: none), without decoding."""
        ...

    def replay(self) -> Iterator[list[Any]]: ...
    def verify_chain(self) -> ChainReport:
        """Recompute the hash chain from the stored events (reading only)."""
        ...

    def chain_anchor(self) -> tuple[str, int, bool]:
        """The chain recomputed over every stored event, their number, and whether any
        boundary predates the chain (what ``Session.ChainStarted`` records)."""
        ...

    def close(self) -> None: ...


class StorageOpener(Protocol):
    def __call__(
        self, url: str, *, session: str, durability: str | None, read_only: bool
    ) -> Storage: ...
