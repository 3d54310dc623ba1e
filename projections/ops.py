"""The projector: one pure function from a batch of domain events to read-model row ops.

The same function serves inline projection (the recorder applies the ops in the events'
own transaction), ``rebuild`` (replay the event log into fresh tables) and the §10.1 test
oracle (replay into the in-memory read model). Ops carry everything an applier needs, so
appliers never re-derive domain rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias

from pico.domain.conversation import Conversation
from pico.domain.session import Session
from pico.domain.state import SESSION_SCOPE, StateWrite, conversation_scope
from pico.domain.task import Task

__all__ = [
    "PROJECTED",
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
    "make_row",
    "project",
]


class PutSession(NamedTuple):
    pass


class PutClaim(NamedTuple):
    owner: str


class PutRoot(NamedTuple):
    conversation_id: int


class PutCommit(NamedTuple):
    first: int
    last: int
    scope: str


class CreateConversation(NamedTuple):
    conversation_id: int
    source_conversation_id: int | None
    source_as_of: int | None
    inherit_state: bool
    owner_task_id: int | None
    context: tuple[int, ...]


class PutEntry(NamedTuple):
    entry_id: int
    conversation_id: int
    kind: str
    content: str
    metadata: str | None
    key: str | None
    by_task_id: int | None
    commit_end: int


class AppendContext(NamedTuple):
    conversation_id: int
    seq: int
    ids: tuple[int, ...]
    revision: int


class ReplacePrefix(NamedTuple):
    conversation_id: int
    seq: int
    through: int
    removed: int
    replacement: tuple[int, ...]
    revision: int


class ResetContext(NamedTuple):
    conversation_id: int
    seq: int
    ids: tuple[int, ...]
    revision: int


class DeleteConversation(NamedTuple):
    conversation_id: int
    seq: int


class EstablishAddress(NamedTuple):
    """Persist an address's scope kind and rewind policy on first use."""

    scope_kind: str  # session | conversation | working
    kind: str  # value | list
    namespace: str
    key: str
    rewind: bool


class PutValue(NamedTuple):
    """Current (sticky/session/working) value: overwrite."""

    scope: str
    namespace: str
    key: str
    seq: int
    value: str


class DropValue(NamedTuple):
    scope: str
    namespace: str
    key: str


class PutVersion(NamedTuple):
    """A rewindable conversation value version; ``value`` None records a deletion."""

    conversation_id: int
    namespace: str
    key: str
    seq: int
    value: str | None


class AppendElement(NamedTuple):
    scope: str
    namespace: str
    key: str
    element_id: int
    value: str


class DropElements(NamedTuple):
    """Clear a sticky/session/working list: only current contents are kept."""

    scope: str
    namespace: str
    key: str


class PutClear(NamedTuple):
    """Clear a rewindable list: a marker; earlier forks still see older elements."""

    scope: str
    namespace: str
    key: str
    seq: int


class RetireWorking(NamedTuple):
    """End a working scope's lifetime: its rows through ``seq`` are deleted."""

    scope: str
    seq: int


class PutTask(NamedTuple):
    task_id: int
    conversation_id: int
    kind: str
    status: str
    role: str
    state: str
    after: tuple[int, ...]
    foreground: bool
    spawned_by: int | None
    not_before: float | None
    required_permit: str | None


class PatchTask(NamedTuple):
    task_id: int
    seq: int
    status: str
    role: str
    state: str | None
    after: tuple[int, ...]
    not_before: float | None
    required_permit: str | None


class MarkTaskAbort(NamedTuple):
    task_id: int
    seq: int


class LinkOwned(NamedTuple):
    task_id: int
    seq: int
    conversation_id: int


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
    | EstablishAddress
    | PutValue
    | DropValue
    | PutVersion
    | AppendElement
    | DropElements
    | PutClear
    | RetireWorking
    | PutTask
    | PatchTask
    | MarkTaskAbort
    | LinkOwned
)


# Row ops are named tuples: ~4 per command, and a frozen dataclass's __init__ costs ~8x.
# The frequent ones are made with ``make_row(Class, (fields...))``: a named tuple's own
# ``__new__`` is a Python function (a call a row), ``tuple.__new__`` is C, and the tuple
# is the same.
make_row = tuple.__new__


_LAST = 1 << 62


# The state events, by scope (each group projects through one helper below).
_CONVERSATION_STATE_EVENTS: tuple[type, ...] = (
    Conversation.ValueSet,
    Conversation.ValueDeleted,
    Conversation.ListAppended,
    Conversation.ListCleared,
)
_SESSION_STATE_EVENTS: tuple[type, ...] = (
    Session.ValueSet,
    Session.ValueDeleted,
    Session.ListAppended,
    Session.ListCleared,
)
_CONVERSATION_STATE = frozenset(_CONVERSATION_STATE_EVENTS)
_SESSION_STATE = frozenset(_SESSION_STATE_EVENTS)
#: The event classes ``project`` makes rows of, in the order it tries them; every other
#: event class makes none (``tests/unit/test_domain.py`` holds that each of the
#: aggregates' event classes is in this tuple or named as making no rows).
PROJECTED: tuple[type, ...] = (
    Session.Committed,
    Task.Patched,
    Task.Created,
    Conversation.EntryAppended,
    Conversation.ContextAppended,
    Conversation.Created,
    Conversation.ContextPrefixReplaced,
    Conversation.ContextReset,
    Conversation.Deleted,
    *_CONVERSATION_STATE_EVENTS,
    *_SESSION_STATE_EVENTS,
    Session.WorkingScopeRetired,
    Task.AbortRequested,
    Task.OwnedConversationLinked,
    Session.Claimed,
    Session.RootDesignated,
    Session.Created,
)
#: Each event class seen, as the known class it is projected as (None: it makes no rows).
#: An event of a subclass is projected as the first known class it is an instance of.
_AS: dict[type, Any] = {cls: cls for cls in PROJECTED}
_UNSEEN = object()


def _projected_class(cls: type) -> type | None:
    found = next((known for known in PROJECTED if issubclass(cls, known)), None)
    _AS[cls] = found
    return found


def project(events: Iterable[Any]) -> list[RowOp]:
    """Project one atomic batch of events (any aggregate order) to row ops."""
    # Dispatched on each event's exact class (``type(e) is``), not by ``isinstance``: the
    # event classes have the library's metaclass, so every ``isinstance`` that fails runs
    # its ``__instancecheck__`` through a special-method lookup (~0.25 us: ~150 a turn).
    # Mutations apply in sequence order, whichever aggregate emitted them; session
    # bookkeeping (no seq) goes last, after the mutations of its commit. Sorted as
    # (order, index, class, event): no key function called back from the sort.
    keyed: list[tuple[int, int, Any, Any]] = []
    commit_end = 0
    for i, e in enumerate(events):
        t = _AS.get(type(e), _UNSEEN)
        if t is _UNSEEN:
            t = _projected_class(type(e))
        seq: Any
        if t is Task.Created:
            seq = e.task_id  # a creation's seq is the new object's id
        else:
            seq = getattr(e, "seq", None)
            if t is Session.Committed:
                commit_end = e.last  # the batch's boundary (the last, in sorted order)
        keyed.append((seq if isinstance(seq, int) else _LAST, i, t, e))
    keyed.sort()
    ops: list[RowOp] = []
    for _, _, t, e in keyed:
        # Most frequent first: every command commits, most patch or create a task.
        if t is Session.Committed:
            ops.append(make_row(PutCommit, (e.first, e.last, e.scope)))
        elif t is Task.Patched:
            ops.append(
                make_row(
                    PatchTask,
                    (
                        e.task_id,
                        e.seq,
                        e.status,
                        e.role,
                        e.state,
                        tuple(e.after),
                        e.not_before,
                        e.required_permit,
                    ),
                )
            )
        elif t is Task.Created:
            ops.append(
                make_row(
                    PutTask,
                    (
                        e.task_id,
                        e.conversation_id,
                        e.kind,
                        e.status,
                        e.role,
                        e.state,
                        tuple(e.after),
                        e.foreground,
                        e.spawned_by,
                        e.not_before,
                        e.required_permit,
                    ),
                )
            )
        elif t is Conversation.EntryAppended:
            ops.append(
                make_row(
                    PutEntry,
                    (
                        e.seq,
                        e.conversation_id,
                        e.kind,
                        e.content,
                        e.metadata,
                        e.key,
                        e.by_task_id,
                        commit_end,
                    ),
                )
            )
        elif t is Conversation.ContextAppended:
            ops.append(
                make_row(AppendContext, (e.conversation_id, e.seq, tuple(e.ids), e.revision))
            )
        elif t is Conversation.Created:
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
        elif t is Conversation.ContextPrefixReplaced:
            ops.append(
                ReplacePrefix(
                    e.conversation_id, e.seq, e.through, e.removed, tuple(e.replacement), e.revision
                )
            )
        elif t is Conversation.ContextReset:
            ops.append(ResetContext(e.conversation_id, e.seq, tuple(e.ids), e.revision))
        elif t is Conversation.Deleted:
            ops.append(DeleteConversation(e.conversation_id, e.seq))
        elif t in _CONVERSATION_STATE:
            ops.extend(_conversation_state(t, e))
        elif t in _SESSION_STATE:
            ops.extend(_session_state(t, e))
        elif t is Session.WorkingScopeRetired:
            ops.append(RetireWorking(e.scope, e.seq))
        elif t is Task.AbortRequested:
            ops.append(MarkTaskAbort(e.task_id, e.seq))
        elif t is Task.OwnedConversationLinked:
            ops.append(LinkOwned(e.task_id, e.seq, e.conversation_id))
        elif t is Session.Claimed:
            ops.append(PutClaim(e.owner))
        elif t is Session.RootDesignated:
            ops.append(PutRoot(e.conversation_id))
        elif t is Session.Created:
            ops.append(PutSession())
    return ops


def _conversation_state(t: type, e: Any) -> list[RowOp]:
    scope = conversation_scope(e.conversation_id)
    kind = "list" if t is Conversation.ListAppended or t is Conversation.ListCleared else "value"
    ops: list[RowOp] = [EstablishAddress("conversation", kind, e.namespace, e.key, e.rewind)]
    if t is Conversation.ValueSet:
        ops.append(
            PutVersion(e.conversation_id, e.namespace, e.key, e.seq, e.value)
            if e.rewind
            else PutValue(scope, e.namespace, e.key, e.seq, e.value)
        )
    elif t is Conversation.ValueDeleted:
        ops.append(
            PutVersion(e.conversation_id, e.namespace, e.key, e.seq, None)
            if e.rewind
            else DropValue(scope, e.namespace, e.key)
        )
    elif t is Conversation.ListAppended:
        ops.append(AppendElement(scope, e.namespace, e.key, e.seq, e.value))
    else:
        ops.append(
            PutClear(scope, e.namespace, e.key, e.seq)
            if e.rewind
            else DropElements(scope, e.namespace, e.key)
        )
    return ops


def _session_state(t: type, e: Any) -> list[RowOp]:
    kind = "list" if t is Session.ListAppended or t is Session.ListCleared else "value"
    ops: list[RowOp] = [EstablishAddress("session", kind, e.namespace, e.key, False)]
    if t is Session.ValueSet:
        ops.append(PutValue(SESSION_SCOPE, e.namespace, e.key, e.seq, e.value))
    elif t is Session.ValueDeleted:
        ops.append(DropValue(SESSION_SCOPE, e.namespace, e.key))
    elif t is Session.ListAppended:
        ops.append(AppendElement(SESSION_SCOPE, e.namespace, e.key, e.seq, e.value))
    else:
        ops.append(DropElements(SESSION_SCOPE, e.namespace, e.key))
    return ops


def project_working(writes: Sequence[StateWrite]) -> list[RowOp]:
    """Working writes are not events; they become the same current-state rows."""
    ops: list[RowOp] = []
    for w in writes:
        kind = "list" if w.op in ("append", "clear") else "value"
        ops.append(EstablishAddress("working", kind, w.namespace, w.key, False))
        if w.op == "set":
            assert w.value is not None
            ops.append(PutValue(w.scope, w.namespace, w.key, w.seq, w.value))
        elif w.op == "delete":
            ops.append(DropValue(w.scope, w.namespace, w.key))
        elif w.op == "append":
            assert w.value is not None
            ops.append(AppendElement(w.scope, w.namespace, w.key, w.seq, w.value))
        else:
            ops.append(DropElements(w.scope, w.namespace, w.key))
    return ops
