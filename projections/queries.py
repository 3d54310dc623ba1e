"""Read-model query semantics over a small set of indexed primitives.

Backends implement ``ReadStore`` (bounded, indexed primitives); ``Queries`` gives them the
meaning of §7: inherited transcript prefixes capped at every ancestor's boundary, historical
context replay (§7.7), pages with cursors. Nothing here loads an aggregate or scans
unrelated history: every primitive is a point lookup or an indexed range.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from pico.domain.errors import (
    HistoricalReadError,
    InvalidArgumentError,
    InvalidPositionError,
    UnknownConversationError,
)
from pico.domain.ids import (
    check_choice,
    check_id,
    check_ids,
    check_limit,
    check_optional_id,
    check_optional_position,
    check_position,
)
from pico.domain.json import loads
from pico.domain.state import conversation_scope
from pico.domain.values import (
    ConversationSnapshot,
    Entry,
    Order,
    Page,
    SessionMeta,
    Source,
    TaskSnapshot,
    ValueItem,
    ValuePage,
)
from pico.projections.mirrors import (
    ContextTails,
    Freshness,
    Generation,
    PrefixValues,
    ValueRow,
    WrittenValues,
    under,
)
from pico.projections.ops import (
    LinkOwned,
    MarkTaskAbort,
    PatchTask,
    PutCommit,
    PutEntry,
    PutTask,
    make_row,
)

__all__ = ["ConvRow", "EditRow", "EntryRow", "Queries", "ReadStore", "replay_context"]

MAX_PAGE = 1000

# The store's rows are named tuples: built for every row read (several per command), and a
# frozen dataclass's __init__ costs ~8x a tuple's. They stay immutable.


class ConvRow(NamedTuple):
    id: int
    created_seq: int
    source_conversation_id: int | None
    source_as_of: int | None
    inherit_state: bool
    owner_task_id: int | None
    prefix_revision: int
    deleted_seq: int | None


class EntryRow(NamedTuple):
    id: int
    conversation_id: int
    kind: str
    key: str | None
    metadata: str | None
    by_task_id: int | None
    commit_end: int
    content: str | None  # None when not requested


class TaskRow(NamedTuple):
    id: int
    conversation_id: int
    kind: str
    status: str
    role: str
    state: str
    after: tuple[int, ...]
    foreground: bool
    spawned_by: int | None
    owned_conversation_id: int | None
    not_before: float | None
    required_permit: str | None
    abort_requested: bool
    updated_seq: int


class EditRow(NamedTuple):
    conversation_id: int
    seq: int
    op: str  # create | append | replace | reset
    ids: tuple[int, ...]
    removed: int
    revision: int


class ReadStore(Protocol):
    def read(self) -> AbstractContextManager[object]: ...
    def meta(self) -> SessionMeta | None: ...
    def is_main_boundary(self, position: int) -> bool: ...
    def conversation_rows(self, ids: Sequence[int]) -> dict[int, ConvRow]: ...
    def current_contexts(self, ids: Sequence[int]) -> dict[int, tuple[int, ...]]: ...
    def context_tail(
        self, conversation_id: int, after_position: int | None
    ) -> tuple[int, list[tuple[int, int]]] | None: ...
    def scan_conversation_rows(
        self,
        *,
        source: int | None,
        owner: int | None,
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[ConvRow]: ...
    def entry_rows(self, ids: Sequence[int], *, content: bool) -> dict[int, EntryRow]: ...
    def entry_range(
        self,
        conversation_id: int,
        *,
        gt: int | None,
        le: int | None,
        order: Order,
        limit: int,
        kind: str | None,
        key: str | None,
        content: bool,
    ) -> list[EntryRow]: ...
    def last_base_edit(self, conversation_id: int, position: int) -> EditRow | None: ...
    def edits_between(self, conversation_id: int, gt: int, le: int) -> list[EditRow]: ...
    def revision_as_of(self, conversation_id: int, position: int) -> int: ...
    def conversation_chain(self, conversation_id: int) -> list[ConvRow]: ...
    def task_rows(self, ids: Sequence[int]) -> dict[int, TaskRow]: ...
    def scan_task_rows(
        self,
        *,
        conversation_ids: Sequence[int] | None,
        live: bool | None,
        role: str | None,
        kind: str | None,
        foreground: bool | None,
        abort_requested: bool | None,
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[TaskRow]: ...
    def owned_conversations(self, conversation_id: int) -> list[int]: ...
    def value_versions(
        self, levels: Sequence[tuple[int, int]], namespace: str, key: str
    ) -> list[tuple[int, str | None] | None]: ...
    def last_clears(
        self, levels: Sequence[tuple[str, int]], namespace: str, key: str
    ) -> list[int | None]: ...
    def list_ranges(
        self,
        segments: Sequence[tuple[str, int | None, int]],
        namespace: str,
        key: str,
        *,
        order: Order,
        limit: int,
    ) -> list[tuple[int, str]]: ...
    def address_policy(
        self, scope_kind: str, kind: str, namespace: str, key: str
    ) -> bool | None: ...
    def current_value(self, scope: str, namespace: str, key: str) -> tuple[int, str] | None: ...
    def scan_values(
        self, scope: str, *, namespace: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str, int, str]]: ...


def replay_context(base: EditRow, edits: Sequence[EditRow]) -> list[int]:
    """§7.7: start from the latest create/reset, apply later edits in order."""
    ctx = list(base.ids)
    for edit in edits:
        if edit.op == "append":
            ctx.extend(edit.ids)
        elif edit.op == "replace":
            ctx = list(edit.ids) + ctx[edit.removed :]
        else:  # reset (a create never follows the base)
            ctx = list(edit.ids)
    return ctx


def _to_entry(row: EntryRow) -> Entry:
    meta = loads(row.metadata) if row.metadata is not None else None
    return Entry(
        id=row.id,
        conversation_id=row.conversation_id,
        kind=row.kind,
        commit_end=row.commit_end,
        content=loads(row.content) if row.content is not None else None,
        metadata=meta if isinstance(meta, dict) else None,
        key=row.key,
        by_task_id=row.by_task_id,
        has_content=row.content is not None,
    )


_ORDERS = ("asc", "desc")


def _page_args(after: int | None, before: int | None, order: Order, limit: int) -> int:
    """The shared cursor arguments of every page read, checked once; returns the limit."""
    check_optional_position(after, "after")
    check_optional_position(before, "before")
    check_choice(order, "order", _ORDERS)
    return check_limit(limit, maximum=MAX_PAGE)


def _optional_str(value: object, what: str) -> None:
    if value is not None and type(value) is not str:
        raise InvalidArgumentError(
            f"{what} must be a string or None, got {value!r} ({type(value).__name__})"
        )


def _optional_bool(value: object, what: str) -> None:
    if value is not None and type(value) is not bool:
        raise InvalidArgumentError(
            f"{what} must be True, False or None, got {value!r} ({type(value).__name__})"
        )


def entry_row(op: PutEntry) -> EntryRow:
    """The entry record ``op`` writes: what every backend's ``pico_entries`` row holds (the
    memory read model and the owner's recent entries both keep it)."""
    return EntryRow(
        op.entry_id,
        op.conversation_id,
        op.kind,
        op.key,
        op.metadata,
        op.by_task_id,
        op.commit_end,
        op.content,
    )


#: How many entries the owner keeps of those it saved last (``Queries.remember``): a
#: turn's context projection reads back the few it just appended.
RECENT_ENTRIES = 256


class Queries:
    """Public read semantics over one session's ``ReadStore``."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        #: The entries the session's owner saved last, by id (``own_entries``; None: not
        #: kept). An entry never changes once saved, so ``get_entries`` answers these
        #: without a read while the owner's mirrors are good (``_recent_generation``: not
        #: after a lost batch or another writer's commit, not off the writer's thread);
        #: ``forget_entries`` drops them when a batch may have been lost.
        self._recent: OrderedDict[int, EntryRow] | None = None
        self._recent_generation: Generation | None = None
        #: The owner's context tails (``own_tails``; None: every read asks the store).
        self._tails: ContextTails | None = None

    # -- the owner's recent entries and context tails
    def own_entries(self, fresh: Freshness) -> None:
        """Keep the entries the owner saves while ``fresh`` says its mirrors are good."""
        recent: OrderedDict[int, EntryRow] = OrderedDict()
        self._recent = recent
        self._recent_generation = Generation(fresh, recent.clear)

    def disown_entries(self) -> None:
        self._recent = None
        self._recent_generation = None

    def own_tails(self, fresh: Freshness | None) -> None:
        """Keep the owner's context tails while ``fresh`` says its mirrors are good (None:
        stop keeping them)."""
        self._tails = None if fresh is None else ContextTails(fresh)

    def remember(self, ops: Sequence[object]) -> None:
        """Keep the entries a saved batch wrote (its ``PutEntry`` row ops), as the store's
        rows hold them, and the context tails it changed."""
        if self._tails is not None:
            self._tails.track(ops)
        recent = self._recent
        if recent is None:
            return
        for op in ops:
            if type(op) is PutEntry:
                recent[op.entry_id] = entry_row(op)
        while len(recent) > RECENT_ENTRIES:
            recent.popitem(last=False)

    def forget_entries(self) -> None:
        if self._recent is not None:
            self._recent.clear()

    # -- session
    def meta(self) -> SessionMeta | None:
        with self.store.read():
            return self.store.meta()

    def main_head(self) -> int:
        m = self.meta()
        return m.main_head if m else 0

    def is_main_boundary(self, position: int) -> bool:
        check_position(position, "position")
        with self.store.read():
            return self.store.is_main_boundary(position)

    # -- conversations
    def lineage(self, conversation_id: int) -> list[tuple[int, int]]:
        """[(ancestor, cutoff), ...] nearest first; one point read per fork level."""
        check_id(conversation_id, "conversation_id")
        with self.store.read():
            return self._lineage(conversation_id)

    def _lineage(self, conversation_id: int) -> list[tuple[int, int]]:
        return transcript_lineage(self.store.conversation_chain(conversation_id), conversation_id)

    def owners(self, ids: Sequence[int]) -> dict[int, int | None]:
        """Owner task of each conversation: one point read each, never the context."""
        ids = check_ids(ids, "conversation ids")
        with self.store.read():
            rows = self.store.conversation_rows(ids)
        return {i: r.owner_task_id for i, r in rows.items()}

    def get_conversations(
        self, ids: Sequence[int], as_of: int | None = None
    ) -> dict[int, ConversationSnapshot]:
        ids = check_ids(ids, "conversation ids")
        check_optional_position(as_of, "as_of")
        with self.store.read():
            rows = self.store.conversation_rows(ids)
            out: dict[int, ConversationSnapshot] = {}
            if as_of is None:
                live = [r.id for r in rows.values()]
                contexts = self.store.current_contexts(live)
                for r in rows.values():
                    out[r.id] = self._snapshot(
                        r, contexts.get(r.id, ()), r.prefix_revision, r.deleted_seq is not None
                    )
                return out
            for r in rows.values():
                if r.created_seq > as_of:
                    continue
                ctx = self._context_as_of(r.id, as_of)
                rev = self.store.revision_as_of(r.id, as_of)
                deleted = r.deleted_seq is not None and r.deleted_seq <= as_of
                out[r.id] = self._snapshot(r, tuple(ctx), rev, deleted)
            return out

    @staticmethod
    def _snapshot(
        r: ConvRow, context: Sequence[int], revision: int, deleted: bool
    ) -> ConversationSnapshot:
        source = (
            Source(r.source_conversation_id, r.source_as_of)
            if r.source_conversation_id is not None and r.source_as_of is not None
            else None
        )
        return ConversationSnapshot(
            id=r.id,
            context=tuple(context),
            source=source,
            inherit_state=r.inherit_state,
            prefix_revision=revision,
            owner_task_id=r.owner_task_id,
            created_seq=r.created_seq,
            deleted=deleted,
        )

    def scan_conversations(
        self,
        *,
        source_conversation_id: int | None = None,
        owner_task_id: int | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[ConversationSnapshot]:
        check_optional_id(source_conversation_id, "source_conversation_id")
        check_optional_id(owner_task_id, "owner_task_id")
        limit = _page_args(after, before, order, limit)
        with self.store.read():
            meta = self.store.meta()
            rows = self.store.scan_conversation_rows(
                source=source_conversation_id,
                owner=owner_task_id,
                gt=after,
                lt=before,
                order=order,
                limit=limit + 1,
            )
            more = len(rows) > limit
            rows = rows[:limit]
            contexts = self.store.current_contexts([r.id for r in rows])
            items = tuple(
                self._snapshot(
                    r, contexts.get(r.id, ()), r.prefix_revision, r.deleted_seq is not None
                )
                for r in rows
            )
            head = meta.head if meta else 0
            return Page(items, head, rows[-1].id if more and rows else None)

    # -- context
    def context_tail(
        self, conversation_id: int, after_position: int | None = None
    ) -> tuple[int, list[tuple[int, int]]] | None:
        """(prefix revision, [(position, entry id), ...] after ``after_position``) of the
        current context, in one snapshot; positions only grow between prefix revisions."""
        check_id(conversation_id, "conversation_id")
        check_optional_position(after_position, "after_position")
        tails = self._tails
        if tails is not None and tails.current() is not None:
            kept = tails.get(conversation_id, after_position)
            if kept is not None:
                return kept
        else:
            tails = None  # no owner's tails now: read, keep nothing
        with self.store.read():
            found = self.store.context_tail(conversation_id, after_position)
        if tails is not None and found is not None:
            tails.keep(conversation_id, after_position, found)
        return found

    def context_as_of(self, conversation_id: int, position: int) -> tuple[int, ...]:
        check_id(conversation_id, "conversation_id")
        check_position(position, "position")
        with self.store.read():
            return tuple(self._context_as_of(conversation_id, position))

    def _context_as_of(self, conversation_id: int, position: int) -> list[int]:
        base = self.store.last_base_edit(conversation_id, position)
        if base is None:
            raise InvalidPositionError(
                f"conversation {conversation_id} did not exist at position {position}"
            )
        edits = self.store.edits_between(conversation_id, base.seq, position)
        return replay_context(base, edits)

    # -- entries
    def get_entries(self, ids: Sequence[int], *, content: bool = True) -> dict[int, Entry]:
        ids = check_ids(ids, "entry ids")
        found: dict[int, Entry] = {}
        recent = self._recent
        generation = self._recent_generation
        if recent and content and generation is not None and generation.current() is not None:
            missing: list[int] = []
            for i in ids:
                row = recent.get(i)
                if row is None:
                    missing.append(i)
                else:
                    found[i] = _to_entry(row)
            if not missing:
                return found
            ids = missing
        with self.store.read():
            rows = self.store.entry_rows(ids, content=content)
        found.update((i, _to_entry(r)) for i, r in rows.items())
        return found

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
    ) -> Page[Entry]:
        """A transcript page: the inherited prefix plus local entries, each entry keeping
        its original conversation id. Filters apply before the limit."""
        check_id(conversation_id, "conversation_id")
        limit = _page_args(after, before, order, limit)
        check_optional_position(as_of, "as_of")
        _optional_str(kind, "kind")
        _optional_str(key, "key")
        with self.store.read():
            meta = self.store.meta()
            main_head = meta.main_head if meta else 0
            cut = main_head if as_of is None else min(as_of, main_head)
            row = self.store.conversation_rows([conversation_id]).get(conversation_id)
            if row is None or row.created_seq > cut:
                raise UnknownConversationError(conversation_id, f" at position {cut}")
            # Oldest segment first: (conversation, inclusive upper bound).
            segments = [(a, min(c, cut)) for a, c in reversed(self._lineage(conversation_id))]
            segments.append((conversation_id, cut))
            if order == "desc":
                segments.reverse()
            items: list[EntryRow] = []
            want = limit + 1
            for conv, upper in segments:
                if before is not None:
                    upper = min(upper, before - 1)
                if after is not None and upper <= after:
                    if order == "asc":
                        continue
                    break
                got = self.store.entry_range(
                    conv,
                    gt=after,
                    le=upper,
                    order=order,
                    limit=want - len(items),
                    kind=kind,
                    key=key,
                    content=content,
                )
                items.extend(got)
                if len(items) >= want:
                    break
            more = len(items) > limit
            items = items[:limit]
            return Page(
                tuple(_to_entry(r) for r in items), cut, items[-1].id if more and items else None
            )


def transcript_lineage(chain: Sequence[ConvRow], conversation_id: int) -> list[tuple[int, int]]:
    """[(ancestor, cutoff), ...] nearest first from a conversation's source chain (the
    conversation itself first), with the tighter cutoff at every level."""
    if not chain:
        raise UnknownConversationError(conversation_id)
    out: list[tuple[int, int]] = []
    cutoff: int | None = None
    for row in chain:
        if row.source_conversation_id is None or row.source_as_of is None:
            break
        cutoff = row.source_as_of if cutoff is None else min(cutoff, row.source_as_of)
        out.append((row.source_conversation_id, cutoff))
    return out


def _conversation_of(scope: str) -> int | None:
    if scope.startswith("conversation/"):
        return int(scope.split("/", 1)[1])
    return None


class StateQueries:
    """§4.4: scoped state reads. Values come back as (seq, JSON text); the typed address
    decodes them."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        #: The session's head without a read, where the session's owner knows it (its
        #: live-task mirror: ``TaskQueries.mirrored_head``); None, or an answer of None,
        #: reads the session row.
        self.known_head: Callable[[], int | None] | None = None
        #: The owner's values under a prefix (``own_prefixes``; None: scans ask the store).
        self._prefixed: PrefixValues | None = None
        #: The current values the owner wrote (``own_prefixes``; None: reads ask the store).
        self._written: WrittenValues | None = None

    def own_prefixes(self, fresh: Freshness | None) -> None:
        """Keep the owner's values under a prefix (``values_under``) and the current values
        it writes (``get_value``) while ``fresh`` says its mirrors are good (None: stop
        keeping them)."""
        self._prefixed = None if fresh is None else PrefixValues(fresh)
        self._written = None if fresh is None else WrittenValues(fresh)

    def track(self, ops: Sequence[object]) -> None:
        """Apply a saved batch's value ops to what the owner keeps."""
        if self._prefixed is not None:
            self._prefixed.track(ops)
        if self._written is not None:
            self._written.track(ops)

    def _cutoff(self, as_of: int | None) -> int:
        meta = self.store.meta()
        main_head = meta.main_head if meta else 0
        return main_head if as_of is None else min(as_of, main_head)

    def _head(self) -> int:
        known = self.known_head
        head = None if known is None else known()
        if head is not None:
            return head
        meta = self.store.meta()
        return meta.head if meta else 0

    def _state_levels(self, conversation_id: int, cutoff: int) -> list[tuple[int, int]]:
        """[(conversation, cutoff), ...] nearest first, following historical-state sources
        with the tighter cutoff at every ancestor, ending where fallback ends (§4.4)."""
        chain = self.store.conversation_chain(conversation_id)
        if not chain:
            raise UnknownConversationError(conversation_id)
        levels = [(conversation_id, cutoff)]
        for row in chain:
            if not row.inherit_state or row.source_conversation_id is None:
                break
            assert row.source_as_of is not None
            cutoff = min(cutoff, row.source_as_of)
            levels.append((row.source_conversation_id, cutoff))
        return levels

    def address_policy(self, scope_kind: str, kind: str, namespace: str, key: str) -> bool | None:
        with self.store.read():
            return self.store.address_policy(scope_kind, kind, namespace, key)

    def get_value(
        self, scope: str, namespace: str, key: str, *, rewind: bool, as_of: int | None = None
    ) -> tuple[int, str] | None:
        check_optional_position(as_of, "as_of")
        conversation = _conversation_of(scope)
        if not (rewind and conversation is not None):
            if as_of is not None:
                raise HistoricalReadError(
                    f"{namespace!r} in {scope} is sticky or working state, which has no "
                    "history; read it without as_of"
                )
            written = self._written
            if written is not None:
                kept, value = written.get(scope, namespace, key)
                if kept:
                    return value
            with self.store.read():
                return self.store.current_value(scope, namespace, key)
        with self.store.read():
            levels = self._state_levels(conversation, self._cutoff(as_of))
            for found in self.store.value_versions(levels, namespace, key):
                if found is not None:  # the nearest level with a version decides
                    seq, text = found
                    return None if text is None else (seq, text)
            return None

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
    ) -> Page[tuple[int, str]]:
        limit = _page_args(after, before, order, limit)
        check_optional_position(as_of, "as_of")
        conversation = _conversation_of(scope)
        with self.store.read():
            upper_cap = None if before is None else before - 1
            if not (rewind and conversation is not None):
                if as_of is not None:
                    raise HistoricalReadError(
                        f"list {namespace!r} in {scope} is sticky or working state, which has "
                        "no history; read it without as_of"
                    )
                rows = self.store.list_ranges(
                    [(scope, after, upper_cap if upper_cap is not None else 2**62)],
                    namespace,
                    key,
                    order=order,
                    limit=limit + 1,
                )
                more = len(rows) > limit
                rows = rows[:limit]
                return Page(tuple(rows), self._head(), rows[-1][0] if more and rows else None)
            cutoff = self._cutoff(as_of)
            levels = [
                (conversation_scope(c), cut) for c, cut in self._state_levels(conversation, cutoff)
            ]
            clears = self.store.last_clears(levels, namespace, key)
            # Nearest first: (scope, exclusive lower bound, inclusive upper); a clear ends
            # the inherited range.
            segments: list[tuple[str, int | None, int]] = []
            for (seg_scope, cut), clear in zip(levels, clears, strict=True):
                lower = clear if after is None else (after if clear is None else max(clear, after))
                upper = cut if upper_cap is None else min(cut, upper_cap)
                if lower is None or upper > lower:
                    segments.append((seg_scope, lower, upper))
                if clear is not None:
                    break
            items = (
                self.store.list_ranges(segments, namespace, key, order=order, limit=limit + 1)
                if segments
                else []
            )
            more = len(items) > limit
            items = items[:limit]
            return Page(tuple(items), cutoff, items[-1][0] if more and items else None)

    def scan_values(
        self,
        scope: str,
        *,
        namespace: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> ValuePage:
        """Current values of one scope ordered by (namespace, key); the cursor is the last
        (namespace, key) returned."""
        limit = check_limit(limit, maximum=MAX_PAGE)
        _optional_str(namespace, "namespace")
        if after is not None and not (
            type(after) is tuple and len(after) == 2 and all(type(a) is str for a in after)
        ):
            raise InvalidArgumentError(
                "after must be a (namespace, key) tuple of strings from a previous page's "
                f"next, or None; got {after!r}"
            )
        with self.store.read():
            rows = self.store.scan_values(scope, namespace=namespace, after=after, limit=limit + 1)
            head = self._head()
        more = len(rows) > limit
        rows = rows[:limit]
        items = tuple(ValueItem(ns, key or None, seq, loads(text)) for ns, key, seq, text in rows)
        return ValuePage(items, head, (rows[-1][0], rows[-1][1]) if more and rows else None)

    def values_under(self, scope: str, prefix: str) -> list[ValueRow]:
        """Every current value of ``scope`` under ``prefix`` (``mirrors.under``: its
        namespace starts with it) in (namespace, key) order, as (namespace, key, seq, JSON
        text): one seek past ``(prefix, "")`` and pages to the last, in one snapshot. The
        session's owner answers from one such read and its own saves since."""
        prefixed = self._prefixed
        if prefixed is not None and prefixed.current() is not None:
            kept = prefixed.get(scope, prefix)
            if kept is not None:
                return kept
            rows = self._scan_under(scope, prefix)
            prefixed.keep(scope, prefix, rows)
            return rows
        return self._scan_under(scope, prefix)

    def _scan_under(self, scope: str, prefix: str) -> list[ValueRow]:
        out: list[ValueRow] = []
        after = (prefix, "")
        with self.store.read():
            while True:
                rows = self.store.scan_values(scope, namespace=None, after=after, limit=500)
                for row in rows:
                    if not under(prefix, row[0], row[1]):
                        return out
                    out.append(row)
                if len(rows) < 500:
                    return out
                after = (rows[-1][0], rows[-1][1])


#: How many of the tasks its saves ended the owner keeps (``TaskQueries._ended``).
ENDED_TASKS = 64

#: The row ops that change a task record (ops.py), in the order ``next_task_row`` tests.
TaskOp = PutTask | PatchTask | MarkTaskAbort | LinkOwned


def next_task_row(op: TaskOp, row: TaskRow | None) -> TaskRow:
    """The task record after ``op`` (``row``: the record before it; None for ``PutTask``):
    what every backend's ``pico_tasks`` row holds then. The memory read model and the
    owner's live-task mirror both apply task ops with it."""
    if isinstance(op, PatchTask):
        assert row is not None
        # Built directly, not with _replace (a status change per command, applied by the
        # read model and the owner's mirror both), made in C (ops.py ``make_row``).
        return make_row(
            TaskRow,
            (
                row.id,
                row.conversation_id,
                row.kind,
                op.status,
                op.role,
                row.state if op.state is None else op.state,
                tuple(op.after),
                row.foreground,
                row.spawned_by,
                row.owned_conversation_id,
                op.not_before,
                op.required_permit,
                row.abort_requested,
                op.seq,
            ),
        )
    if isinstance(op, PutTask):
        return make_row(
            TaskRow,
            (
                op.task_id,
                op.conversation_id,
                op.kind,
                op.status,
                op.role,
                op.state,
                tuple(op.after),
                op.foreground,
                op.spawned_by,
                None,
                op.not_before,
                op.required_permit,
                False,
                op.task_id,
            ),
        )
    assert row is not None
    if isinstance(op, MarkTaskAbort):
        return row._replace(abort_requested=True, updated_seq=op.seq)
    return row._replace(owned_conversation_id=op.conversation_id, updated_seq=op.seq)


def _live_page(
    live: dict[int, TaskRow],
    conversations: set[int] | None,
    equal: tuple[str | None, str | None, bool | None, bool | None],
    gt: int | None,
    lt: int | None,
    order: Order,
    limit: int,
) -> list[TaskRow]:
    """A page of ``scan_task_rows(live=True, ...)`` from the owner's mirror (its rows in
    id order): the same open id window, order, filters and limit as the store's query."""
    rows = live.values() if order == "asc" else reversed(live.values())
    window = (r for r in rows if (gt is None or r.id > gt) and (lt is None or r.id < lt))
    return task_page(window, conversations, None, equal, limit)


def task_page(
    rows: Iterable[TaskRow],
    conversations: set[int] | None,
    live: bool | None,
    equal: tuple[str | None, str | None, bool | None, bool | None],
    limit: int,
) -> list[TaskRow]:
    """The first ``limit`` of ``rows`` (already in the page's order and id window) that
    pass ``scan_task_rows``'s filters: the conversations, terminal only with ``live=False``,
    and each of role, kind, foreground and abort_requested (``equal``) that is not None.
    The memory read model and the owner's mirror page with it."""
    role, kind, foreground, abort_requested = equal
    out: list[TaskRow] = []
    for r in rows:
        if (
            (conversations is None or r.conversation_id in conversations)
            and (live is not False or r.role == "terminal")
            and (role is None or r.role == role)
            and (kind is None or r.kind == kind)
            and (foreground is None or r.foreground == foreground)
            and (abort_requested is None or r.abort_requested == abort_requested)
        ):
            out.append(r)
            if len(out) >= limit:
                break
    return out


#: TaskSnapshot's fields, in order: TaskRow holds the same, in the same order.
_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(TaskSnapshot))
if TaskRow._fields != _TASK_FIELDS:  # _task fills one from the other by position
    raise TypeError(f"TaskRow {TaskRow._fields} and TaskSnapshot {_TASK_FIELDS} differ")
if hasattr(TaskSnapshot, "__post_init__") or hasattr(TaskSnapshot, "__slots__"):
    raise TypeError("TaskSnapshot checks or slots its fields: _task would bypass them")
_new = object.__new__


def _task(r: TaskRow, state: bool = True) -> TaskSnapshot:
    # Filled into the instance's own dict, not through the frozen dataclass's __init__ (an
    # object.__setattr__ per field, fourteen here; about twelve snapshots a turn): equal,
    # hashing and printing alike.
    snapshot = _new(TaskSnapshot)
    fields = snapshot.__dict__
    fields.update(zip(_TASK_FIELDS, r, strict=True))
    fields["state"] = loads(r.state) if state else None
    fields["after"] = tuple(r.after)
    return snapshot


class TaskQueries:
    """Current task records (§7.2): tasks are never inherited and never historical.

    The session's owner (``own``: the handle that claimed it for writing, the only writer
    of its tasks) keeps a copy of the live task rows in memory, read once from the store
    and then kept by ``track`` with the row ops of every batch it saves, so the
    scheduler's passes (about seven a turn) and launches read no store. ``token`` says
    cheaply whether anyone else changed the store since (another handle that claimed the
    session, a rolled-back batch): when its value moves, the mirror is read again.
    ``forget`` drops it (a save or flush that failed, a claim); ``disown`` turns it off."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        self._token: Callable[[], object] | None = None  # None: no mirror
        self._seen: object = None
        self._live: dict[int, TaskRow] | None = None  # id order: ids grow with creation
        self._meta: dict[int, TaskSnapshot] = {}  # state-less snapshots of _live's rows
        self._head: int | None = None  # the session's head, kept with _live
        #: The rows of the tasks the owner's saves ended last (a terminal row never
        #: changes again), which a join reads back when its inputs settle.
        self._ended: dict[int, TaskRow] = {}
        #: Moves whenever the mirror is dropped or read again from the store: what the
        #: owner's other mirrors (``fresh``) were loaded under is then no longer known.
        self.generation = 0

    # ------------------------------------------------------------------ the mirror
    def own(self, token: Callable[[], object]) -> None:
        """Mirror the live tasks from now on (SQLite, where each read is a statement; the
        memory read model answers them as cheaply itself). ``token()`` must change
        whenever anything but this owner's saves changes the store's tasks, and be None
        where the mirror must not answer (another thread than the writer's, which reads
        only committed rows). The mirror also answers live scans (``scan_tasks(live=True)``)
        and the session's head (``mirrored_head``)."""
        self._token = token
        self.forget()

    def disown(self) -> None:
        self._token = None
        self.forget()

    def track(self, ops: Sequence[object]) -> None:
        """Apply a saved batch's task ops to the mirror (when it is loaded)."""
        live = self._live
        if live is None:
            return
        for op in ops:
            if type(op) is PutCommit:
                self._head = op.last
            elif isinstance(op, TaskOp):
                task_id = op.task_id
                row = live.get(task_id)
                if row is None and not isinstance(op, PutTask):
                    # Only live tasks take patches, marks and links: the mirror missed one.
                    self.forget()
                    return
                row = next_task_row(op, row)
                self._meta.pop(task_id, None)
                if row.role == "terminal":
                    live.pop(task_id, None)
                    self._ended[task_id] = row
                else:
                    live[task_id] = row
        ended = self._ended
        while len(ended) > ENDED_TASKS:
            del ended[next(iter(ended))]

    def forget(self) -> None:
        self._live = None
        self._head = None
        self._meta.clear()
        self._ended.clear()
        self.generation += 1

    def fresh(self) -> int | None:
        """The mirror's ``generation`` once its token says that nothing but the owner's
        own saves changed the store since it was loaded; None without a mirror. The
        owner's other mirrors (the queue values, the context tails) are good while it is
        the generation they were loaded under: they are kept by the same saves."""
        return None if self._mirror() is None else self.generation

    def _mirror(self) -> dict[int, TaskRow] | None:
        if self._token is None:
            return None
        seen = self._token()
        if seen is None:  # not the writer's thread: the store answers
            return None
        if self._live is None or seen != self._seen:
            self.generation += 1
            self._meta.clear()
            self._ended.clear()
            with self.store.read():  # the rows and the head of one snapshot
                meta = self.store.meta()
                self._live = {r.id: r for r in self._scan_live()}
            self._head = meta.head if meta else 0
            self._seen = seen
        return self._live

    def mirrored_head(self) -> int | None:
        """The session's head as the owner's mirror knows it (the row's, kept by each
        saved batch's commit), or None without a mirror: what ``StateQueries.known_head``
        asks instead of reading the session row."""
        return None if self._mirror() is None else self._head

    def _scan_live(self) -> list[TaskRow]:
        """Every live task row in id order: partial-index pages of 500 in one snapshot."""
        out: list[TaskRow] = []
        after: int | None = None
        with self.store.read():
            while True:
                rows = self.store.scan_task_rows(
                    conversation_ids=None,
                    live=True,
                    role=None,
                    kind=None,
                    foreground=None,
                    abort_requested=None,
                    gt=after,
                    lt=None,
                    order="asc",
                    limit=500,
                )
                out.extend(rows)
                if len(rows) < 500:
                    return out
                after = rows[-1].id

    # ------------------------------------------------------------------ queries
    def get_tasks(self, ids: Sequence[int]) -> dict[int, TaskSnapshot]:
        ids = check_ids(ids, "task ids")
        live = self._mirror()
        if live is not None:
            ended = self._ended
            found = {}
            for i in ids:
                row = live.get(i) or ended.get(i)
                if row is not None:
                    found[i] = _task(row)
            if len(found) == len(set(ids)):
                return found
            ids = [i for i in ids if i not in found]  # terminal or unknown: the store
        else:
            found = {}
        with self.store.read():
            rows = self.store.task_rows(ids)
        found.update((i, _task(r)) for i, r in rows.items())
        return found

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
    ) -> Page[TaskSnapshot]:
        if conversation_ids is not None:
            conversation_ids = check_ids(conversation_ids, "conversation_ids")
        _optional_bool(live, "live")
        _optional_bool(foreground, "foreground")
        _optional_bool(abort_requested, "abort_requested")
        _optional_str(role, "role")
        _optional_str(kind, "kind")
        limit = _page_args(after, before, order, limit)
        if live is None and role is not None and role != "terminal":
            live = True  # a live role lies in the live set: its indexes, never history
        mirror = self._mirror() if live is True else None
        if mirror is not None and self._head is not None:
            rows = _live_page(
                mirror,
                None if conversation_ids is None else set(conversation_ids),
                (role, kind, foreground, abort_requested),
                after,
                before,
                order,
                limit + 1,
            )
            more = len(rows) > limit
            rows = rows[:limit]
            last = rows[-1].id if more and rows else None
            return Page(tuple(_task(r) for r in rows), self._head, last)
        with self.store.read():
            meta = self.store.meta()
            rows = self.store.scan_task_rows(
                conversation_ids=conversation_ids,
                live=live,
                role=role,
                kind=kind,
                foreground=foreground,
                abort_requested=abort_requested,
                gt=after,
                lt=before,
                order=order,
                limit=limit + 1,
            )
        more = len(rows) > limit
        rows = rows[:limit]
        head = meta.head if meta else 0
        return Page(tuple(_task(r) for r in rows), head, rows[-1].id if more and rows else None)

    def live_tasks(self, *, state: bool = True) -> list[TaskSnapshot]:
        """Every live task of the session in id order (the scheduler's pass): partial-index
        pages of 500 in one snapshot, never terminal history. ``state=False`` leaves each
        ``state`` undecoded (None): the scheduling metadata only, for a pass that reads the
        whole record of just the tasks it launches."""
        live = self._mirror()
        if live is None:
            return [_task(r, state) for r in self._scan_live()]
        if state:
            return [_task(r) for r in live.values()]
        meta = self._meta
        out: list[TaskSnapshot] = []
        for task_id, row in live.items():
            snapshot = meta.get(task_id)
            if snapshot is None:  # frozen and state-less: shared until its row changes
                snapshot = meta[task_id] = _task(row, False)
            out.append(snapshot)
        return out

    def owned_conversations(self, conversation_id: int) -> list[int]:
        check_id(conversation_id, "conversation_id")
        with self.store.read():
            return self.store.owned_conversations(conversation_id)


def iter_pages(queries: Queries, conversation_id: int, *, limit: int = 500) -> Iterator[Entry]:
    """Every entry of a transcript, page by page (audit and export helper)."""
    after: int | None = None
    while True:
        page = queries.scan_entries(conversation_id, after=after, limit=limit, content=True)
        yield from page.items
        if page.next is None:
            return
        after = page.next
