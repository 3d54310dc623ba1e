"""What the session's owner keeps of its own read model beside the live-task mirror
(``TaskQueries``), so the reads of a turn ask the store nothing: the tails of its
conversations' contexts (a generation request projects the elements appended since the last
one), the values under a namespace prefix (the input queues, read at every placement) and
the current values it wrote itself (an input's result, read when its turn ends).
Kept where each read is a statement (SQLite: storage.py ``own_tasks``); the memory read
model answers them as cheaply itself.

Each (but the written values, which start empty) is loaded from the store on first use
and then kept by the row ops of every batch the owner saves (``track``), exactly as the
store applies them. Each is good only while the live-task mirror's ``generation`` is the
one it was loaded under (``TaskQueries.fresh``): it moves when that mirror's token says
someone else changed the store (another handle claimed the session) and when the owner's
own batch may have been lost (a failed save or flush, a claim), and then everything here
is read again. Bounded: past its limit a mirror starts over, and what it dropped costs one
read.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from pico.projections.ops import (
    AppendContext,
    CreateConversation,
    DeleteConversation,
    DropValue,
    PutValue,
    ReplacePrefix,
    ResetContext,
    RetireWorking,
)

__all__ = ["ContextTails", "Freshness", "Generation", "PrefixValues", "ValueRow", "WrittenValues"]

#: The live-task mirror's generation, or None without a mirror (``TaskQueries.fresh``).
Freshness = Callable[[], int | None]

#: How many conversations, and elements of each, the owner keeps.
TAIL_CONVERSATIONS = 64
TAIL_ELEMENTS = 256
#: How many (scope, prefix) value sets the owner keeps, and values in each (a longer set,
#: a long queue, is read from the store each time).
PREFIX_SCOPES = 64
PREFIX_VALUES = 1000
#: How many current values the owner keeps of those it wrote (past it, it starts over).
WRITTEN_VALUES = 1024

#: A value row as the store scans it: (namespace, key, seq, JSON text).
ValueRow = tuple[str, str, int, str]


#: The ops that change a current value (a tuple made once, not a union each op).
_VALUE_OPS = (PutValue, DropValue)


class Generation:
    """What a mirror was loaded under: ``current()`` is the generation to use now (None:
    no mirror, read the store), having dropped what an earlier generation loaded."""

    def __init__(self, fresh: Freshness, clear: Callable[[], None]) -> None:
        self._fresh = fresh
        self._clear = clear
        self._loaded: int | None = None

    def current(self) -> int | None:
        generation = self._fresh()
        if generation != self._loaded:
            self._clear()
            self._loaded = generation
        return generation


class _Tail:
    """A context's prefix revision, its last position (None: empty) and its newest
    elements (a suffix of the context; ``complete``: all of it)."""

    __slots__ = ("complete", "elements", "last", "revision")

    def __init__(self, revision: int, elements: list[tuple[int, int]], *, complete: bool) -> None:
        self.revision = revision
        self.last = elements[-1][0] if elements else None
        self.complete = complete and len(elements) <= TAIL_ELEMENTS
        self.elements = elements[-TAIL_ELEMENTS:]

    def after(self, position: int) -> list[tuple[int, int]] | None:
        """The elements after ``position``, or None when some of them are not kept."""
        elements = self.elements
        if self.last is None or position >= self.last:
            return []
        if not self.complete and position < elements[0][0]:
            return None
        start = bisect.bisect_right(elements, position, key=lambda e: e[0])
        return elements[start:]

    def append(self, ids: Sequence[int]) -> None:
        # Positions follow the last one (both stores number an append so).
        start = 0 if self.last is None else self.last + 1
        self.elements.extend((start + i, entry) for i, entry in enumerate(ids))
        if ids:
            self.last = start + len(ids) - 1
        if len(self.elements) > TAIL_ELEMENTS:
            del self.elements[: len(self.elements) - TAIL_ELEMENTS]
            self.complete = False


class ContextTails:
    """The owner's context tails: ``ReadStore.context_tail`` answered from what it read
    once and the appends it saved since (a replacement, reset or deletion drops the
    conversation: the next read loads it again)."""

    def __init__(self, fresh: Freshness) -> None:
        self._tails: dict[int, _Tail] = {}
        self._generation = Generation(fresh, self._tails.clear)

    def current(self) -> int | None:
        """Whether the tails may answer now (None: read the store, keep nothing)."""
        return self._generation.current()

    def get(
        self, conversation_id: int, after_position: int | None
    ) -> tuple[int, list[tuple[int, int]]] | None:
        """(revision, elements after ``after_position``) if kept, else None."""
        tail = self._tails.get(conversation_id)
        if tail is None or after_position is None:
            return None
        elements = tail.after(after_position)
        return None if elements is None else (tail.revision, elements)

    def keep(
        self,
        conversation_id: int,
        after_position: int | None,
        found: tuple[int, list[tuple[int, int]]],
    ) -> None:
        """Keep what the store answered for ``after_position``: all of the context, or a
        suffix whose last position it names (an empty answer after a position does not
        say where the context ends: not kept)."""
        revision, elements = found
        if after_position is not None and not elements:
            return
        tails = self._tails
        tails.pop(conversation_id, None)
        tails[conversation_id] = _Tail(revision, list(elements), complete=after_position is None)
        while len(tails) > TAIL_CONVERSATIONS:
            del tails[next(iter(tails))]

    def track(self, ops: Sequence[object]) -> None:
        tails = self._tails
        if not tails:
            return
        for op in ops:
            if isinstance(op, AppendContext):
                tail = tails.get(op.conversation_id)
                if tail is None:
                    continue
                if op.revision != tail.revision:
                    del tails[op.conversation_id]
                else:
                    tail.append(op.ids)
            elif isinstance(op, _CONTEXT_RESETS):
                tails.pop(op.conversation_id, None)


_CONTEXT_RESETS = (ReplacePrefix, ResetContext, CreateConversation, DeleteConversation)


class WrittenValues:
    """The current (sticky, session, working) values the owner's saves wrote, per scope,
    as ``ReadStore.current_value`` answers them: ``(seq, JSON text)``, or None for a
    deleted value. Nothing is loaded: a value it did not see written is read from the
    store. A retired working scope is dropped whole (its values are the store's again)."""

    def __init__(self, fresh: Freshness) -> None:
        self._scopes: dict[str, dict[tuple[str, str], tuple[int, str] | None]] = {}
        self._count = 0
        self._generation = Generation(fresh, self._clear)

    def _clear(self) -> None:
        self._scopes.clear()
        self._count = 0

    def current(self) -> int | None:
        """Whether what it keeps may answer now (None: read the store)."""
        return self._generation.current()

    def get(self, scope: str, namespace: str, key: str) -> tuple[bool, tuple[int, str] | None]:
        """(kept, the value or None when deleted); (False, None): ask the store."""
        values = self._scopes.get(scope)
        if values is None or (namespace, key) not in values:
            return False, None
        if self._generation.current() is None or scope not in self._scopes:
            return False, None  # no mirror now, or another writer moved it: all dropped
        return True, values[(namespace, key)]

    def track(self, ops: Sequence[object]) -> None:
        for op in ops:
            if type(op) is PutValue:
                self._keep(op.scope, op.namespace, op.key, (op.seq, op.value))
            elif type(op) is DropValue:
                self._keep(op.scope, op.namespace, op.key, None)
            elif type(op) is RetireWorking:
                dropped = self._scopes.pop(op.scope, None)
                if dropped is not None:
                    self._count -= len(dropped)

    def _keep(self, scope: str, namespace: str, key: str, value: tuple[int, str] | None) -> None:
        values = self._scopes.get(scope)
        if values is None:
            values = self._scopes[scope] = {}
        k = (namespace, key)
        if k not in values:
            self._count += 1
            if self._count > WRITTEN_VALUES:  # bounded: start over
                self._clear()
                values = self._scopes[scope] = {}
                self._count = 1
        values[k] = value


def under(prefix: str, namespace: str, key: str) -> bool:
    """Whether a value lies under ``prefix``: its namespace starts with it and it sorts
    after the cursor ``(prefix, "")`` (a scan from that cursor finds it)."""
    return namespace.startswith(prefix) and (namespace, key) > (prefix, "")


class PrefixValues:
    """The owner's values under a namespace prefix, per scope: what one scan found, kept by
    the ``PutValue``/``DropValue`` ops it saved since (a retired scope is dropped)."""

    def __init__(self, fresh: Freshness) -> None:
        self._scopes: dict[str, dict[str, dict[tuple[str, str], tuple[int, str]]]] = {}
        self._generation = Generation(fresh, self._scopes.clear)

    def current(self) -> int | None:
        return self._generation.current()

    def get(self, scope: str, prefix: str) -> list[ValueRow] | None:
        values = self._scopes.get(scope, {}).get(prefix)
        if values is None:
            return None
        return [(ns, key, seq, text) for (ns, key), (seq, text) in sorted(values.items())]

    def keep(self, scope: str, prefix: str, rows: Sequence[ValueRow]) -> None:
        if len(rows) > PREFIX_VALUES:
            return
        scopes = self._scopes
        if scope not in scopes and len(scopes) >= PREFIX_SCOPES:
            del scopes[next(iter(scopes))]
        scopes.setdefault(scope, {})[prefix] = {(ns, k): (seq, text) for ns, k, seq, text in rows}

    def track(self, ops: Sequence[object]) -> None:
        scopes = self._scopes
        if not scopes:
            return
        for op in ops:
            if isinstance(op, _VALUE_OPS):
                prefixes = scopes.get(op.scope)
                if prefixes is None:
                    continue
                for prefix, values in list(prefixes.items()):
                    if under(prefix, op.namespace, op.key):
                        if isinstance(op, PutValue):
                            values[(op.namespace, op.key)] = (op.seq, op.value)
                            if len(values) > PREFIX_VALUES:
                                del prefixes[prefix]  # too long to keep: the store's
                        else:
                            values.pop((op.namespace, op.key), None)
            elif isinstance(op, RetireWorking):
                scopes.pop(op.scope, None)
