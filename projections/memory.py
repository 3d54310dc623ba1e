"""The in-memory read model: indexed dicts and sorted id arrays, one per session.

It is the memory backend's query side and, fed by a replay of any backend's event log,
the §10.1 conformance oracle.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from pico.domain.values import Order, SessionMeta
from pico.projections.ops import (
    AppendContext,
    AppendElement,
    CreateConversation,
    DeleteConversation,
    DropElements,
    DropValue,
    EstablishAddress,
    LinkOwned,
    MarkTaskAbort,
    PatchTask,
    PutClaim,
    PutClear,
    PutCommit,
    PutEntry,
    PutRoot,
    PutSession,
    PutTask,
    PutValue,
    PutVersion,
    ReplacePrefix,
    ResetContext,
    RetireWorking,
    RowOp,
)
from pico.projections.queries import (
    ConvRow,
    EditRow,
    EntryRow,
    TaskRow,
    entry_row,
    next_task_row,
    task_page,
)

__all__ = ["MemoryReadStore"]

#: A frozen dataclass made without its __init__ (``PutCommit`` below).
_new = object.__new__


@dataclass
class _Edits:
    rows: list[EditRow]
    seqs: list[int]
    base_positions: list[int]  # indexes into rows of create/reset edits


def _range(ids: list[int], gt: int | None, le: int | None) -> tuple[int, int]:
    lo = 0 if gt is None else bisect.bisect_right(ids, gt)
    hi = len(ids) if le is None else bisect.bisect_right(ids, le)
    return lo, hi


class MemoryReadStore:
    """One session's read model in memory. ``apply`` is called inside the writer's lock."""

    def __init__(self, session_id: str, lock: threading.RLock | None = None) -> None:
        self.session_id = session_id
        self.lock = lock or threading.RLock()
        self._meta: SessionMeta | None = None
        self._boundaries: set[int] = set()
        self._convs: dict[int, ConvRow] = {}
        self._conv_ids: list[int] = []
        self._by_source: dict[int, list[int]] = {}
        self._by_owner: dict[int, list[int]] = {}
        self._context: dict[int, list[int]] = {}
        self._edits: dict[int, _Edits] = {}
        self._entries: dict[int, EntryRow] = {}
        self._by_conv: dict[int, list[int]] = {}
        self._by_kind: dict[tuple[int, str], list[int]] = {}
        self._by_key: dict[tuple[int, str], list[int]] = {}
        # Scoped state.
        self._policies: dict[tuple[str, str, str, str], bool] = {}
        self._values: dict[tuple[str, str, str], tuple[int, str]] = {}
        self._value_keys: dict[str, list[tuple[str, str]]] = {}  # scope -> sorted keys
        self._versions: dict[tuple[int, str, str], tuple[list[int], list[str | None]]] = {}
        self._elements: dict[tuple[str, str, str], tuple[list[int], list[str]]] = {}
        self._element_keys: dict[str, set[tuple[str, str]]] = {}
        self._clears: dict[tuple[str, str, str], list[int]] = {}
        # Tasks: current records; live ids kept sorted (the "partial index").
        self._tasks: dict[int, TaskRow] = {}
        self._task_ids: list[int] = []
        self._live: list[int] = []
        self._owned_by_conv: dict[int, list[int]] = {}  # conversation -> owned conversations

    # ------------------------------------------------------------------ writes
    def apply(self, ops: Sequence[RowOp]) -> None:
        with self.lock:
            self._apply(ops)

    def _apply(self, ops: Sequence[RowOp]) -> None:
        # Most frequent first (an agent turn: 10 commits, 9 task patches, 5 entries, 5
        # context appends, 5 new tasks, 2 values): each op walks this chain.
        # The loop is here, not a call an op (an agent turn applies ~40).
        for op in ops:
            if isinstance(op, PutCommit):
                meta = self._meta
                assert meta is not None
                main = op.scope == "main"
                # Built directly: dataclasses.replace introspects the fields on every call
                # (one commit row per command), and the frozen dataclass's __init__ sets
                # each field with object.__setattr__: its dict is filled instead.
                row = _new(SessionMeta)
                fields = row.__dict__
                fields["session_id"] = meta.session_id
                fields["head"] = op.last
                fields["main_head"] = op.last if main else meta.main_head
                fields["root_id"] = meta.root_id
                fields["owner"] = meta.owner
                fields["extra"] = meta.extra
                self._meta = row
                if main:
                    self._boundaries.add(op.last)
            elif isinstance(op, PatchTask):
                task = self._tasks[op.task_id]
                if op.role == "terminal" and task.role != "terminal":
                    del self._live[bisect.bisect_left(self._live, op.task_id)]
                self._tasks[op.task_id] = next_task_row(op, task)
            elif isinstance(op, PutEntry):
                self._entries[op.entry_id] = entry_row(op)
                self._by_conv.setdefault(op.conversation_id, []).append(op.entry_id)
                self._by_kind.setdefault((op.conversation_id, op.kind), []).append(op.entry_id)
                if op.key is not None:
                    self._by_key.setdefault((op.conversation_id, op.key), []).append(op.entry_id)
            elif isinstance(op, AppendContext):
                self._context[op.conversation_id].extend(op.ids)
                self._edit(EditRow(op.conversation_id, op.seq, "append", op.ids, 0, op.revision))
            elif isinstance(op, PutTask):
                self._tasks[op.task_id] = next_task_row(op, None)
                self._task_ids.append(op.task_id)
                if op.role != "terminal":
                    self._live.append(op.task_id)
            elif isinstance(op, EstablishAddress):
                self._policies.setdefault((op.scope_kind, op.kind, op.namespace, op.key), op.rewind)
            elif isinstance(op, PutValue):
                k = (op.scope, op.namespace, op.key)
                if k not in self._values:
                    bisect.insort(self._value_keys.setdefault(op.scope, []), (op.namespace, op.key))
                self._values[k] = (op.seq, op.value)
            elif isinstance(op, RetireWorking):
                for ns, key in list(self._value_keys.get(op.scope, [])):
                    cur = self._values.get((op.scope, ns, key))
                    if cur is not None and cur[0] <= op.seq:
                        self._drop_value(op.scope, ns, key)
                for ns, key in list(self._element_keys.get(op.scope, set())):
                    got = self._elements.get((op.scope, ns, key))
                    if got is not None:
                        cut = bisect.bisect_right(got[0], op.seq)
                        del got[0][:cut], got[1][:cut]
            elif isinstance(op, CreateConversation):
                cid = op.conversation_id
                self._convs[cid] = ConvRow(
                    cid,
                    cid,
                    op.source_conversation_id,
                    op.source_as_of,
                    op.inherit_state,
                    op.owner_task_id,
                    0,
                    None,
                )
                self._conv_ids.append(cid)
                if op.source_conversation_id is not None:
                    self._by_source.setdefault(op.source_conversation_id, []).append(cid)
                if op.owner_task_id is not None:
                    self._by_owner.setdefault(op.owner_task_id, []).append(cid)
                self._context[cid] = list(op.context)
                self._edit(EditRow(cid, cid, "create", op.context, 0, 0))
            elif isinstance(op, ReplacePrefix):
                cid = op.conversation_id
                self._context[cid] = list(op.replacement) + self._context[cid][op.removed :]
                self._convs[cid] = self._convs[cid]._replace(prefix_revision=op.revision)
                self._edit(EditRow(cid, op.seq, "replace", op.replacement, op.removed, op.revision))
            elif isinstance(op, ResetContext):
                cid = op.conversation_id
                self._context[cid] = list(op.ids)
                self._convs[cid] = self._convs[cid]._replace(prefix_revision=op.revision)
                self._edit(EditRow(cid, op.seq, "reset", op.ids, 0, op.revision))
            elif isinstance(op, DeleteConversation):
                cid = op.conversation_id
                self._convs[cid] = self._convs[cid]._replace(deleted_seq=op.seq)
            elif isinstance(op, DropValue):
                self._drop_value(op.scope, op.namespace, op.key)
            elif isinstance(op, PutVersion):
                seqs, vals = self._versions.setdefault(
                    (op.conversation_id, op.namespace, op.key), ([], [])
                )
                seqs.append(op.seq)
                vals.append(op.value)
            elif isinstance(op, AppendElement):
                ids, vals2 = self._elements.setdefault((op.scope, op.namespace, op.key), ([], []))
                ids.append(op.element_id)
                vals2.append(op.value)
                self._element_keys.setdefault(op.scope, set()).add((op.namespace, op.key))
            elif isinstance(op, DropElements):
                self._elements.pop((op.scope, op.namespace, op.key), None)
            elif isinstance(op, PutClear):
                self._clears.setdefault((op.scope, op.namespace, op.key), []).append(op.seq)
            elif isinstance(op, MarkTaskAbort):
                self._tasks[op.task_id] = next_task_row(op, self._tasks[op.task_id])
            elif isinstance(op, LinkOwned):
                task = self._tasks[op.task_id]
                self._tasks[op.task_id] = next_task_row(op, task)
                self._owned_by_conv.setdefault(task.conversation_id, []).append(op.conversation_id)
            elif isinstance(op, PutSession):
                self._meta = SessionMeta(self.session_id, 0, 0, None, None)
            elif isinstance(op, PutClaim):
                assert self._meta is not None
                self._meta = replace(self._meta, owner=op.owner)
            elif isinstance(op, PutRoot):
                assert self._meta is not None
                self._meta = replace(self._meta, root_id=op.conversation_id)

    def _drop_value(self, scope: str, namespace: str, key: str) -> None:
        if self._values.pop((scope, namespace, key), None) is not None:
            keys = self._value_keys[scope]
            del keys[bisect.bisect_left(keys, (namespace, key))]

    def _edit(self, row: EditRow) -> None:
        edits = self._edits.setdefault(row.conversation_id, _Edits([], [], []))
        if row.op in ("create", "reset"):
            edits.base_positions.append(len(edits.rows))
        edits.rows.append(row)
        edits.seqs.append(row.seq)

    # ------------------------------------------------------------------ reads
    def read(self) -> AbstractContextManager[object]:
        """The lock itself: every read and ``apply`` hold it, so a reader sees whole
        commits (no generator context manager, no cast: a turn enters ~40 reads)."""
        return self.lock

    def meta(self) -> SessionMeta | None:
        return self._meta

    def is_main_boundary(self, position: int) -> bool:
        return position in self._boundaries

    def conversation_rows(self, ids: Sequence[int]) -> dict[int, ConvRow]:
        return {i: self._convs[i] for i in ids if i in self._convs}

    def context_tail(
        self, conversation_id: int, after_position: int | None
    ) -> tuple[int, list[tuple[int, int]]] | None:
        row = self._convs.get(conversation_id)
        if row is None:
            return None
        context = self._context.get(conversation_id, [])
        start = 0 if after_position is None else after_position + 1
        return row.prefix_revision, [(i, context[i]) for i in range(start, len(context))]

    def current_contexts(self, ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
        return {i: tuple(self._context[i]) for i in ids if i in self._context}

    def scan_conversation_rows(
        self,
        *,
        source: int | None,
        owner: int | None,
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[ConvRow]:
        if source is not None and owner is not None:
            owned = set(self._by_owner.get(owner, []))
            ids = [i for i in self._by_source.get(source, []) if i in owned]
        elif source is not None:
            ids = self._by_source.get(source, [])
        elif owner is not None:
            ids = self._by_owner.get(owner, [])
        else:
            ids = self._conv_ids
        lo, hi = _range(ids, gt, None if lt is None else lt - 1)
        window = ids[lo:hi]
        chosen = window[:limit] if order == "asc" else window[::-1][:limit]
        return [self._convs[i] for i in chosen]

    def entry_rows(self, ids: Sequence[int], *, content: bool) -> dict[int, EntryRow]:
        out: dict[int, EntryRow] = {}
        for i in ids:
            row = self._entries.get(i)
            if row is not None:
                out[i] = row if content else row._replace(content=None)
        return out

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
    ) -> list[EntryRow]:
        if kind is not None and key is not None:
            by_key = self._by_key.get((conversation_id, key), [])
            lo, hi = _range(by_key, gt, le)
            ids = [i for i in by_key[lo:hi] if self._entries[i].kind == kind]
            lo, hi = 0, len(ids)
        else:
            if kind is not None:
                ids = self._by_kind.get((conversation_id, kind), [])
            elif key is not None:
                ids = self._by_key.get((conversation_id, key), [])
            else:
                ids = self._by_conv.get(conversation_id, [])
            lo, hi = _range(ids, gt, le)
        if order == "asc":
            chosen = ids[lo : min(hi, lo + limit)]
        else:
            chosen = ids[max(lo, hi - limit) : hi][::-1]
        rows = [self._entries[i] for i in chosen]
        return rows if content else [r._replace(content=None) for r in rows]

    def last_base_edit(self, conversation_id: int, position: int) -> EditRow | None:
        edits = self._edits.get(conversation_id)
        if edits is None:
            return None
        # The newest create/reset at or before position.
        idx = bisect.bisect_right(edits.seqs, position)
        k = bisect.bisect_right(edits.base_positions, idx - 1) - 1
        if k < 0:
            return None
        return edits.rows[edits.base_positions[k]]

    def edits_between(self, conversation_id: int, gt: int, le: int) -> list[EditRow]:
        edits = self._edits.get(conversation_id)
        if edits is None:
            return []
        lo = bisect.bisect_right(edits.seqs, gt)
        hi = bisect.bisect_right(edits.seqs, le)
        return edits.rows[lo:hi]

    def revision_as_of(self, conversation_id: int, position: int) -> int:
        edits = self._edits.get(conversation_id)
        if edits is None:
            return 0
        idx = bisect.bisect_right(edits.seqs, position) - 1
        return edits.rows[idx].revision if idx >= 0 else 0

    # ------------------------------------------------------------------ state reads
    def address_policy(self, scope_kind: str, kind: str, namespace: str, key: str) -> bool | None:
        return self._policies.get((scope_kind, kind, namespace, key))

    def current_value(self, scope: str, namespace: str, key: str) -> tuple[int, str] | None:
        return self._values.get((scope, namespace, key))

    def value_version(
        self, conversation_id: int, namespace: str, key: str, cutoff: int
    ) -> tuple[int, str | None] | None:
        got = self._versions.get((conversation_id, namespace, key))
        if got is None:
            return None
        i = bisect.bisect_right(got[0], cutoff) - 1
        return None if i < 0 else (got[0][i], got[1][i])

    def list_range(
        self,
        scope: str,
        namespace: str,
        key: str,
        *,
        gt: int | None,
        le: int | None,
        order: Order,
        limit: int,
    ) -> list[tuple[int, str]]:
        got = self._elements.get((scope, namespace, key))
        if got is None:
            return []
        lo, hi = _range(got[0], gt, le)
        if order == "asc":
            idx = range(lo, min(hi, lo + limit))
        else:
            idx = range(hi - 1, max(lo, hi - limit) - 1, -1)
        return [(got[0][i], got[1][i]) for i in idx]

    def last_clear(self, scope: str, namespace: str, key: str, cutoff: int) -> int | None:
        seqs = self._clears.get((scope, namespace, key))
        if not seqs:
            return None
        i = bisect.bisect_right(seqs, cutoff) - 1
        return None if i < 0 else seqs[i]

    def scan_values(
        self, scope: str, *, namespace: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str, int, str]]:
        keys = self._value_keys.get(scope, [])
        lo = 0 if after is None else bisect.bisect_right(keys, after)
        if namespace is not None:
            lo = max(lo, bisect.bisect_left(keys, (namespace, "")))
        out: list[tuple[str, str, int, str]] = []
        for ns, key in keys[lo:]:
            if namespace is not None and ns != namespace:
                break
            seq, value = self._values[(scope, ns, key)]
            out.append((ns, key, seq, value))
            if len(out) >= limit:
                break
        return out

    # Batched forms used by the queries (one call per logical read).
    def conversation_chain(self, conversation_id: int) -> list[ConvRow]:
        out: list[ConvRow] = []
        row = self._convs.get(conversation_id)
        while row is not None:
            out.append(row)
            if row.source_conversation_id is None:
                break
            row = self._convs.get(row.source_conversation_id)
        return out

    def value_versions(
        self, levels: Sequence[tuple[int, int]], namespace: str, key: str
    ) -> list[tuple[int, str | None] | None]:
        return [self.value_version(c, namespace, key, cut) for c, cut in levels]

    def last_clears(
        self, levels: Sequence[tuple[str, int]], namespace: str, key: str
    ) -> list[int | None]:
        return [self.last_clear(scope, namespace, key, cut) for scope, cut in levels]

    def list_ranges(
        self,
        segments: Sequence[tuple[str, int | None, int]],
        namespace: str,
        key: str,
        *,
        order: Order,
        limit: int,
    ) -> list[tuple[int, str]]:
        ordered = sorted(segments, key=lambda seg: seg[2], reverse=order == "desc")
        out: list[tuple[int, str]] = []
        for scope, lower, upper in ordered:
            out.extend(
                self.list_range(
                    scope, namespace, key, gt=lower, le=upper, order=order, limit=limit - len(out)
                )
            )
            if len(out) >= limit:
                break
        return out

    # ------------------------------------------------------------------ task reads
    def task_rows(self, ids: Sequence[int]) -> dict[int, TaskRow]:
        return {i: self._tasks[i] for i in ids if i in self._tasks}

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
    ) -> list[TaskRow]:
        ids = self._live if live else self._task_ids
        lo, hi = _range(ids, gt, None if lt is None else lt - 1)
        window = ids[lo:hi] if order == "asc" else ids[lo:hi][::-1]
        convs = None if conversation_ids is None else set(conversation_ids)
        tasks = self._tasks
        return task_page(  # filters before the limit
            (tasks[i] for i in window),
            convs,
            live,
            (role, kind, foreground, abort_requested),
            limit,
        )

    def owned_conversations(self, conversation_id: int) -> list[int]:
        return list(self._owned_by_conv.get(conversation_id, []))
