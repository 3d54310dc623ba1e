"""The Conversation aggregate: a linear transcript plus the context that selects from it.

Its state stays small: the current context ids, the prefix revision, the historical source
and the exchange bookkeeping needed to validate edits. Entry contents live only in events
and in the read model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from pico.domain.errors import (
    ContextEditError,
    ConversationDeletedError,
    ExchangeSplitError,
    NotInContextError,
    StalePrefixError,
    UnknownEntryError,
)
from pico.domain.exchange import EntryRef, ExchangeDelta, complete_exchange
from pico.domain.ids import conversation_uuid
from pico.domain.trigger import create_aggregate
from pico.domain.trigger import trigger_event as fast_trigger_event

__all__ = ["Conversation"]


class Conversation(Aggregate):
    """One conversation of a session. Every event carries the mutation's ``seq``."""

    # The library's trigger_event less its per-event overhead (domain/trigger.py).
    trigger_event = fast_trigger_event

    class Created(Aggregate.Created):
        session_id: str
        conversation_id: int
        seq: int
        source_conversation_id: int | None
        source_as_of: int | None
        inherit_state: bool
        owner_task_id: int | None
        context: list[int]
        lineage: list[list[int]]
        calls: dict[str, list[str]]
        answers: dict[str, str]

    # The two per-entry events apply themselves and are triggered directly: the @event
    # decorator's argument binding cost ~5% of a small command (2,000-turn benchmark).
    class EntryAppended(Aggregate.Event):  # the aggregate keeps no per-entry state
        conversation_id: int
        seq: int
        kind: str
        content: str
        metadata: str | None
        key: str | None
        by_task_id: int | None

    class ContextAppended(Aggregate.Event):
        conversation_id: int
        seq: int
        ids: list[int]
        revision: int
        calls: dict[str, list[str]]
        answers: dict[str, str]

        def apply(self, aggregate: Any) -> None:
            aggregate.context.extend(self.ids)
            aggregate.newest = self.ids[-1]
            aggregate._select(self.ids, self.calls, self.answers)

    class ContextPrefixReplaced(Aggregate.Event):
        conversation_id: int
        seq: int
        through: int
        removed: int
        replacement: list[int]
        revision: int
        calls: dict[str, list[str]]
        answers: dict[str, str]

    class ContextReset(Aggregate.Event):
        conversation_id: int
        seq: int
        ids: list[int]
        revision: int
        calls: dict[str, list[str]]
        answers: dict[str, str]

    class Deleted(Aggregate.Event):
        conversation_id: int
        seq: int

    # Conversation-scoped state; ``rewind`` is the address's persisted policy.
    class ValueSet(Aggregate.Event):
        conversation_id: int
        seq: int
        namespace: str
        key: str
        value: str
        rewind: bool

    class ValueDeleted(Aggregate.Event):
        conversation_id: int
        seq: int
        namespace: str
        key: str
        rewind: bool

    class ListAppended(Aggregate.Event):
        conversation_id: int
        seq: int
        namespace: str
        key: str
        value: str
        rewind: bool

    class ListCleared(Aggregate.Event):
        conversation_id: int
        seq: int
        namespace: str
        key: str
        rewind: bool

    @staticmethod
    def create_id(session_id: str, conversation_id: int, **_: Any) -> UUID:
        return conversation_uuid(session_id, conversation_id)

    @event(Created)
    def __init__(
        self,
        *,
        session_id: str,
        conversation_id: int,
        seq: int,
        source_conversation_id: int | None,
        source_as_of: int | None,
        inherit_state: bool,
        owner_task_id: int | None,
        context: list[int],
        lineage: list[list[int]],
        calls: dict[str, list[str]],
        answers: dict[str, str],
    ) -> None:
        self.session_id = session_id
        self.conversation_id = conversation_id
        self.created_seq = seq
        self.source_conversation_id = source_conversation_id
        self.source_as_of = source_as_of
        self.inherit_state = inherit_state
        self.owner_task_id = owner_task_id
        self.context: list[int] = list(context)
        # [[ancestor id, cutoff], ...]: the inherited transcript, nearest ancestor first.
        self.lineage: list[list[int]] = [list(pair) for pair in lineage]
        self.prefix_revision = 0
        self.deleted = False
        # Exchange bookkeeping for selected entries only (str keys: JSON-friendly snapshots).
        self.exchange_of: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        # Appended ids must be newer than every selected id (transcript order, no duplicates).
        self.newest = max(self.context, default=0)
        self._select(self.context, calls, answers)

    @property
    def snapshot_scale(self) -> int:
        """How many storage snapshot intervals apart this conversation's snapshots are:
        one copies the whole context, so a long context is snapshotted proportionally less
        often and the snapshot work per event stays flat as a conversation grows (a reload
        then replays at most that many intervals of cheap events). The largest power of two
        not above ``len(context) // 1000``, at least 1."""
        units = len(self.context) // 1000
        return 1 << (units.bit_length() - 1) if units > 1 else 1

    # ------------------------------------------------------------------ factories

    @classmethod
    def start(
        cls,
        *,
        session_id: str,
        conversation_id: int,
        source: tuple[int, int] | None = None,
        source_lineage: Sequence[Sequence[int]] = (),
        inherit_state: bool = True,
        owner_task_id: int | None = None,
        context: Sequence[int] = (),
        refs: Mapping[int, EntryRef] | None = None,
    ) -> Conversation:
        """Create a conversation; a fork passes its source, the source's lineage and the
        historical context at the fork position."""
        lineage: list[list[int]] = []
        if source is not None:
            src_id, as_of = source
            lineage.append([src_id, as_of])
            lineage.extend([int(a), min(int(c), as_of)] for a, c in source_lineage)
        delta = complete_exchange(conversation_id, context, refs or {})
        # The library's constructor less its per-call overhead (domain/trigger.py).
        conv: Conversation = create_aggregate(
            cls,
            cls.Created,
            session_id=session_id,
            conversation_id=conversation_id,
            seq=conversation_id,
            source_conversation_id=source[0] if source else None,
            source_as_of=source[1] if source else None,
            inherit_state=inherit_state if source is not None else False,
            owner_task_id=owner_task_id,
            context=list(context),
            lineage=lineage,
            calls=delta.calls,
            answers=delta.answers,
        )
        return conv

    # ------------------------------------------------------------------ commands

    def append_entry(
        self,
        *,
        seq: int,
        kind: str,
        content: str,
        metadata: str | None,
        key: str | None,
        by_task_id: int | None,
    ) -> None:
        self._check_live()
        if not isinstance(kind, str) or not kind:
            raise ContextEditError(self.conversation_id, "an entry needs a non-empty kind")
        self.trigger_event(
            self.EntryAppended,
            conversation_id=self.conversation_id,
            seq=seq,
            kind=kind,
            content=content,
            metadata=metadata,
            key=key,
            by_task_id=by_task_id,
        )

    def append_context(self, *, seq: int, ids: Sequence[int], refs: Mapping[int, EntryRef]) -> None:
        self._check_live()
        if not ids:
            raise ContextEditError(self.conversation_id, "append_context needs at least one id")
        self._check_visible(ids, refs)
        newest = self.newest
        for entry_id in ids:
            if entry_id <= newest:
                raise ContextEditError(
                    self.conversation_id,
                    f"entry {entry_id} cannot be appended after {newest}: appended ids must "
                    "be newer than every selected id, in transcript order, without duplicates",
                )
            newest = entry_id
        delta = ExchangeDelta()
        open_calls = dict(self.pending)
        for entry_id in ids:
            ref = refs[entry_id]
            if ref.tool_call_id is not None:
                if ref.tool_call_id not in open_calls:
                    raise ExchangeSplitError(
                        self.conversation_id,
                        f"entry {entry_id} answers tool call {ref.tool_call_id!r}, which is not "
                        "an open call in this context; select the call first",
                    )
                del open_calls[ref.tool_call_id]
                delta.answers[str(entry_id)] = ref.tool_call_id
            if ref.tool_calls:
                delta.calls[str(entry_id)] = list(ref.tool_calls)
                for call in ref.tool_calls:
                    open_calls[call] = entry_id
        self.trigger_event(
            self.ContextAppended,
            conversation_id=self.conversation_id,
            seq=seq,
            ids=list(ids),
            revision=self.prefix_revision,
            calls=delta.calls,
            answers=delta.answers,
        )

    def replace_context_prefix(
        self,
        *,
        seq: int,
        through: int,
        replacement: Sequence[int],
        refs: Mapping[int, EntryRef],
        expected_revision: int | None = None,
    ) -> None:
        self._check_live()
        if expected_revision is not None and expected_revision != self.prefix_revision:
            raise StalePrefixError(
                self.conversation_id,
                f"the replacement was prepared against prefix revision {expected_revision} but "
                f"the context is now at revision {self.prefix_revision}; prepare it again",
            )
        try:
            index = self.context.index(through)
        except ValueError:
            raise NotInContextError(
                self.conversation_id,
                f"entry {through} is not in the current context, so there is no prefix "
                "ending at it to replace; pass an id from the current context "
                "(conversation.snapshot().context)",
            ) from None
        self._check_no_pending("replace a context prefix")
        self._check_visible(replacement, refs)
        if len(set(replacement)) != len(replacement):
            raise ContextEditError(self.conversation_id, "the replacement repeats an id")
        suffix = self.context[index + 1 :]
        clash = set(replacement).intersection(suffix)
        if clash:
            raise ContextEditError(
                self.conversation_id,
                f"replacement ids {sorted(clash)} are already in the retained suffix",
            )
        prefix_openers = {
            self.exchange_of[str(e)]
            for e in self.context[: index + 1]
            if str(e) in self.exchange_of
        }
        if prefix_openers:
            for e in suffix:
                opener = self.exchange_of.get(str(e))
                if opener in prefix_openers:
                    raise ExchangeSplitError(
                        self.conversation_id,
                        f"replacing through {through} would separate tool call entry {opener} "
                        f"from its result {e}; replace through the end of the exchange",
                    )
        delta = complete_exchange(self.conversation_id, replacement, refs)
        self._context_prefix_replaced(
            conversation_id=self.conversation_id,
            seq=seq,
            through=through,
            removed=index + 1,
            replacement=list(replacement),
            revision=self.prefix_revision + 1,
            calls=delta.calls,
            answers=delta.answers,
        )

    def reset_context(self, *, seq: int, ids: Sequence[int], refs: Mapping[int, EntryRef]) -> None:
        self._check_live()
        self._check_no_pending("reset the context")
        self._check_visible(ids, refs)
        if len(set(ids)) != len(ids):
            raise ContextEditError(self.conversation_id, "reset_context repeats an id")
        delta = complete_exchange(self.conversation_id, ids, refs)
        self._context_reset(
            conversation_id=self.conversation_id,
            seq=seq,
            ids=list(ids),
            revision=self.prefix_revision + 1,
            calls=delta.calls,
            answers=delta.answers,
        )

    def delete(self, *, seq: int) -> None:
        self._check_live()
        self._deleted(conversation_id=self.conversation_id, seq=seq)

    # State events change nothing in the aggregate (projections apply them): triggered
    # directly, like the per-command events, after the liveness check.
    def set_value(self, *, seq: int, namespace: str, key: str, value: str, rewind: bool) -> None:
        self._state(
            self.ValueSet, seq=seq, namespace=namespace, key=key, value=value, rewind=rewind
        )

    def delete_value(self, *, seq: int, namespace: str, key: str, rewind: bool) -> None:
        self._state(self.ValueDeleted, seq=seq, namespace=namespace, key=key, rewind=rewind)

    def append_list(self, *, seq: int, namespace: str, key: str, value: str, rewind: bool) -> None:
        self._state(
            self.ListAppended, seq=seq, namespace=namespace, key=key, value=value, rewind=rewind
        )

    def clear_list(self, *, seq: int, namespace: str, key: str, rewind: bool) -> None:
        self._state(self.ListCleared, seq=seq, namespace=namespace, key=key, rewind=rewind)

    def _state(self, event_class: Any, **fields: Any) -> None:
        self._check_live()
        self.trigger_event(event_class, conversation_id=self.conversation_id, **fields)

    # ------------------------------------------------------------------ checks

    def check_accepts_work(self) -> None:
        """Deleted conversations accept no new work (§6.6)."""
        self._check_live()

    def _check_live(self) -> None:
        if self.deleted:
            raise ConversationDeletedError(self.conversation_id)

    def _check_no_pending(self, what: str) -> None:
        if self.pending:
            call, opener = next(iter(self.pending.items()))
            raise ExchangeSplitError(
                self.conversation_id,
                f"cannot {what} while tool call {call!r} of entry {opener} is unanswered; "
                "append its result first",
            )

    def is_visible(self, ref: EntryRef) -> bool:
        if ref.conversation_id == self.conversation_id:
            return True
        return any(ref.conversation_id == a and ref.id <= c for a, c in self.lineage)

    def _check_visible(self, ids: Sequence[int], refs: Mapping[int, EntryRef]) -> None:
        for entry_id in ids:
            ref = refs.get(entry_id)
            if ref is None:
                raise UnknownEntryError(entry_id, " in this session")
            if not self.is_visible(ref):
                raise ContextEditError(
                    self.conversation_id,
                    f"entry {entry_id} belongs to conversation {ref.conversation_id} and is not "
                    "part of this conversation's transcript or inherited prefix",
                )

    # ------------------------------------------------------------------ mutators

    def _select(
        self, ids: Sequence[int], calls: Mapping[str, list[str]], answers: Mapping[str, str]
    ) -> None:
        """Record exchange membership of newly selected ids, in context order."""
        for entry_id in ids:
            call = answers.get(str(entry_id))
            if call is not None:
                self.exchange_of[str(entry_id)] = self.pending.pop(call, entry_id)
            opened = calls.get(str(entry_id))
            if opened:
                self.exchange_of[str(entry_id)] = entry_id
                for c in opened:
                    self.pending[c] = entry_id

    def _drop_exchange(self, removed: Sequence[int]) -> None:
        for entry_id in removed:
            self.exchange_of.pop(str(entry_id), None)

    @event(ContextPrefixReplaced)
    def _context_prefix_replaced(
        self,
        conversation_id: int,
        seq: int,
        through: int,
        removed: int,
        replacement: list[int],
        revision: int,
        calls: dict[str, list[str]],
        answers: dict[str, str],
    ) -> None:
        self._drop_exchange(self.context[:removed])
        self.context = list(replacement) + self.context[removed:]
        self.newest = max(self.context, default=0)
        self.prefix_revision = revision
        self._select(replacement, calls, answers)

    @event(ContextReset)
    def _context_reset(
        self,
        conversation_id: int,
        seq: int,
        ids: list[int],
        revision: int,
        calls: dict[str, list[str]],
        answers: dict[str, str],
    ) -> None:
        self.context = list(ids)
        self.newest = max(self.context, default=0)
        self.exchange_of = {}
        self.pending = {}
        self.prefix_revision = revision
        self._select(ids, calls, answers)

    @event(Deleted)
    def _deleted(self, conversation_id: int, seq: int) -> None:
        self.deleted = True
