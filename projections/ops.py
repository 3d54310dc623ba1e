"""The projector: one pure function from a batch of domain events to read-model row ops.

The same function serves inline projection (the recorder applies the ops in the events'
own transaction), ``rebuild`` (replay the event log into fresh tables) and the §10.1 test
oracle (replay into the in-memory read model). Ops carry everything an applier needs, so
appliers never re-derive domain rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from pico.domain.conversation import Conversation
from pico.domain.session import Session

__all__ = [
    "AppendContext",
    "CreateConversation",
    "DeleteConversation",
    "PutClaim",
    "PutCommit",
    "PutEntry",
    "PutRoot",
    "PutSession",
    "ReplacePrefix",
    "ResetContext",
    "RowOp",
    "project",
]


@dataclass(frozen=True)
class PutSession:
    pass


@dataclass(frozen=True)
class PutClaim:
    owner: str


@dataclass(frozen=True)
class PutRoot:
    conversation_id: int


@dataclass(frozen=True)
class PutCommit:
    first: int
    last: int
    scope: str


@dataclass(frozen=True)
class CreateConversation:
    conversation_id: int
    source_conversation_id: int | None
    source_as_of: int | None
    inherit_state: bool
    owner_task_id: int | None
    context: tuple[int, ...]


@dataclass(frozen=True)
class PutEntry:
    entry_id: int
    conversation_id: int
    kind: str
    content: str
    metadata: str | None
    key: str | None
    by_task_id: int | None
    commit_end: int


@dataclass(frozen=True)
class AppendContext:
    conversation_id: int
    seq: int
    ids: tuple[int, ...]
    revision: int


@dataclass(frozen=True)
class ReplacePrefix:
    conversation_id: int
    seq: int
    through: int
    removed: int
    replacement: tuple[int, ...]
    revision: int


@dataclass(frozen=True)
class ResetContext:
    conversation_id: int
    seq: int
    ids: tuple[int, ...]
    revision: int


@dataclass(frozen=True)
class DeleteConversation:
    conversation_id: int
    seq: int


RowOp: TypeAlias = (
    PutSession
    | PutClaim
    | PutRoot
    | PutCommit
    | CreateConversation
    | PutEntry
    | AppendContext
    | ReplacePrefix
    | ResetContext
    | DeleteConversation
)


def _order(event: Any) -> int:
    # Mutations apply in sequence order, whichever aggregate emitted them; session
    # bookkeeping (no seq) goes last, after the mutations of its commit.
    seq = getattr(event, "seq", None)
    return seq if isinstance(seq, int) else 1 << 62


def project(events: Iterable[Any]) -> list[RowOp]:
    """Project one atomic batch of events (any aggregate order) to row ops."""
    ordered: Sequence[Any] = sorted(events, key=_order)
    commit_end = 0
    for e in ordered:
        if isinstance(e, Session.Committed):
            commit_end = e.last
    ops: list[RowOp] = []
    for e in ordered:
        if isinstance(e, Conversation.EntryAppended):
            ops.append(
                PutEntry(
                    e.seq,
                    e.conversation_id,
                    e.kind,
                    e.content,
                    e.metadata,
                    e.key,
                    e.by_task_id,
                    commit_end,
                )
            )
        elif isinstance(e, Conversation.ContextAppended):
            ops.append(AppendContext(e.conversation_id, e.seq, tuple(e.ids), e.revision))
        elif isinstance(e, Conversation.Created):
            ops.append(
                CreateConversation(
                    e.conversation_id,
                    e.source_conversation_id,
                    e.source_as_of,
                    e.inherit_state,
                    e.owner_task_id,
                    tuple(e.context),
                )
            )
        elif isinstance(e, Conversation.ContextPrefixReplaced):
            ops.append(
                ReplacePrefix(
                    e.conversation_id, e.seq, e.through, e.removed, tuple(e.replacement), e.revision
                )
            )
        elif isinstance(e, Conversation.ContextReset):
            ops.append(ResetContext(e.conversation_id, e.seq, tuple(e.ids), e.revision))
        elif isinstance(e, Conversation.Deleted):
            ops.append(DeleteConversation(e.conversation_id, e.seq))
        elif isinstance(e, Session.Committed):
            ops.append(PutCommit(e.first, e.last, e.scope))
        elif isinstance(e, Session.Claimed):
            ops.append(PutClaim(e.owner))
        elif isinstance(e, Session.RootDesignated):
            ops.append(PutRoot(e.conversation_id))
        elif isinstance(e, Session.Created):
            ops.append(PutSession())
    return ops
