"""The command builder: read committed state, allocate ids, buffer validated mutations.

A builder sees pre-command committed state; each mutation is validated against committed
state plus the earlier mutations of the same batch, and receives its final sequence number
at once. Nothing is durable, published or returned to other callers until the outer call
persists the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pico.domain.conversation import Conversation
from pico.domain.errors import (
    CommandRejectedError,
    ExchangeSplitError,
    InvalidPositionError,
    UnknownConversationError,
    UnknownEntryError,
)
from pico.domain.exchange import EntryRef
from pico.domain.json import JsonValue, dumps
from pico.domain.values import ConversationSnapshot, Entry, Order, Page

if TYPE_CHECKING:
    from pico.application.line import CommandLine

__all__ = ["Command", "ConversationCommand"]


class Command:
    """The mutation vocabulary of §7.4 plus read-only committed queries."""

    def __init__(self, line: CommandLine) -> None:
        self._line = line
        self._reads = line.storage.reads
        self._allocated = 0
        self._first: int | None = None
        self._entries: dict[int, EntryRef] = {}
        self.touched: dict[int, Conversation] = {}
        self._sealed = False

    # ------------------------------------------------------------------ bookkeeping
    @property
    def first(self) -> int | None:
        return self._first

    @property
    def last(self) -> int | None:
        return None if self._first is None else self._first + self._allocated - 1

    def seal(self) -> None:
        self._sealed = True

    def _alloc(self) -> int:
        if self._sealed:
            raise CommandRejectedError(
                "this command has finished; a builder's transaction cannot be used after it returns"
            )
        seq = self._line.session.next_seq(self._allocated)
        if self._first is None:
            self._first = seq
        self._allocated += 1
        return seq

    def _peek(self) -> int:
        return self._line.session.next_seq(self._allocated)

    def _conversation(self, conversation_id: int) -> Conversation:
        conv = self.touched.get(conversation_id)
        if conv is None:
            conv = self._line.load_conversation(conversation_id)
        return conv

    def _refs(self, ids: Sequence[int]) -> dict[int, EntryRef]:
        refs = {i: self._entries[i] for i in ids if i in self._entries}
        missing = [i for i in ids if i not in refs]
        if missing:
            for i, e in self._reads.get_entries(missing, content=False).items():
                refs[i] = EntryRef.from_metadata(i, e.conversation_id, e.metadata)
        for i in ids:
            if i not in refs:
                raise UnknownEntryError(i, " in this session")
        return refs

    # ------------------------------------------------------------------ reads (committed)
    @property
    def head(self) -> int:
        return self._line.session.head

    @property
    def main_head(self) -> int:
        return self._line.session.main_head

    def get_conversation(
        self, conversation_id: int, as_of: int | None = None
    ) -> ConversationSnapshot | None:
        return self._reads.get_conversations([conversation_id], as_of).get(conversation_id)

    def get_entries(self, ids: Sequence[int], *, content: bool = True) -> dict[int, Entry]:
        return self._reads.get_entries(ids, content=content)

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
        return self._reads.scan_entries(
            conversation_id,
            after=after,
            before=before,
            order=order,
            limit=limit,
            kind=kind,
            key=key,
            as_of=as_of,
            content=content,
        )

    # ------------------------------------------------------------------ mutations
    def create_conversation(self, *, owner_task_id: int | None = None) -> int:
        """Create an empty conversation; returns its id."""
        seq = self._peek()
        conv = Conversation.start(
            session_id=self._line.session_id,
            conversation_id=seq,
            owner_task_id=owner_task_id,
        )
        self._alloc()
        self.touched[seq] = conv
        return seq

    def fork(self, source_id: int, *, at_entry: int | None = None, as_of: int | None = None) -> int:
        """Create a historical fork of ``source_id`` after a complete main commit (§3.3)."""
        if (at_entry is None) == (as_of is None):
            raise InvalidPositionError("fork needs exactly one of at_entry= or as_of=")
        src = self._reads.get_conversations([source_id]).get(source_id)
        if src is None:
            raise UnknownConversationError(source_id)
        lineage = self._reads.lineage(source_id)
        if at_entry is not None:
            entry = self._reads.get_entries([at_entry], content=False).get(at_entry)
            visible = entry is not None and (
                entry.conversation_id == source_id
                or any(entry.conversation_id == a and entry.id <= c for a, c in lineage)
            )
            if entry is None or not visible:
                raise InvalidPositionError(
                    f"entry {at_entry} is not in the transcript of conversation {source_id}; "
                    "pick an entry from its transcript"
                )
            position = entry.commit_end
        else:
            assert as_of is not None
            if not self._reads.is_main_boundary(as_of):
                raise InvalidPositionError(
                    f"position {as_of} is not a complete main commit boundary (it is inside a "
                    "commit, a working commit, or in the future); fork at an entry or at the "
                    "last sequence of a main commit"
                )
            position = as_of
        # Before the source existed, its history is its ancestor's: fork the farthest
        # ancestor whose inherited range still covers the position (the one that existed).
        fork_of, chain = source_id, lineage
        if position < src.created_seq:
            for k, (ancestor, cutoff) in enumerate(lineage):
                if position <= cutoff:
                    fork_of, chain = ancestor, lineage[k + 1 :]
            if fork_of == source_id:
                raise InvalidPositionError(
                    f"conversation {source_id} did not exist at position {position}"
                )
        context = self._reads.context_as_of(fork_of, position)
        refs = self._refs(list(context))
        seq = self._peek()
        try:
            conv = Conversation.start(
                session_id=self._line.session_id,
                conversation_id=seq,
                source=(fork_of, position),
                source_lineage=[list(p) for p in chain],
                inherit_state=True,
                context=context,
                refs=refs,
            )
        except ExchangeSplitError as exc:
            raise InvalidPositionError(
                f"cannot fork conversation {source_id} at {position}: {exc}"
            ) from exc
        self._alloc()
        self.touched[seq] = conv
        return seq

    def append_entry(
        self,
        conversation_id: int,
        kind: str,
        content: JsonValue,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        key: str | None = None,
        by_task_id: int | None = None,
    ) -> int:
        """Append an immutable entry to the transcript; returns its id (its seq)."""
        text = dumps(content, what="entry content")
        meta_text = None if metadata is None else dumps(dict(metadata), what="entry metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise CommandRejectedError("entry metadata must be a JSON object")
        if key is not None and not isinstance(key, str):
            raise CommandRejectedError("an entry key must be a string")
        conv = self._conversation(conversation_id)
        seq = self._peek()
        conv.append_entry(
            seq=seq, kind=kind, content=text, metadata=meta_text, key=key, by_task_id=by_task_id
        )
        self._alloc()
        self.touched[conversation_id] = conv
        self._entries[seq] = EntryRef.from_metadata(seq, conversation_id, metadata)
        return seq

    def append_context(self, conversation_id: int, ids: Sequence[int]) -> None:
        ids = list(ids)
        conv = self._conversation(conversation_id)
        refs = self._refs(ids)
        conv.append_context(seq=self._peek(), ids=ids, refs=refs)
        self._alloc()
        self.touched[conversation_id] = conv

    def replace_context_prefix(
        self,
        conversation_id: int,
        through: int,
        replacement: Sequence[int],
        *,
        expected_revision: int | None = None,
    ) -> None:
        replacement = list(replacement)
        conv = self._conversation(conversation_id)
        refs = self._refs(replacement)
        conv.replace_context_prefix(
            seq=self._peek(),
            through=through,
            replacement=replacement,
            refs=refs,
            expected_revision=expected_revision,
        )
        self._alloc()
        self.touched[conversation_id] = conv

    def reset_context(self, conversation_id: int, ids: Sequence[int] = ()) -> None:
        ids = list(ids)
        conv = self._conversation(conversation_id)
        refs = self._refs(ids)
        conv.reset_context(seq=self._peek(), ids=ids, refs=refs)
        self._alloc()
        self.touched[conversation_id] = conv

    def delete_conversation(self, conversation_id: int) -> None:
        if conversation_id == self._line.session.root_id:
            raise CommandRejectedError(
                f"conversation {conversation_id} is the session's root and cannot be deleted"
            )
        conv = self._conversation(conversation_id)
        conv.delete(seq=self._peek())
        self._alloc()
        self.touched[conversation_id] = conv


class ConversationCommand:
    """A ``Command`` bound to one conversation."""

    def __init__(self, tx: Command, conversation_id: int) -> None:
        self.tx = tx
        self.conversation_id = conversation_id

    def append_entry(
        self,
        kind: str,
        content: JsonValue,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        key: str | None = None,
        by_task_id: int | None = None,
    ) -> int:
        return self.tx.append_entry(
            self.conversation_id, kind, content, metadata=metadata, key=key, by_task_id=by_task_id
        )

    def append_context(self, ids: Sequence[int]) -> None:
        self.tx.append_context(self.conversation_id, ids)

    def replace_context_prefix(
        self, through: int, replacement: Sequence[int], *, expected_revision: int | None = None
    ) -> None:
        self.tx.replace_context_prefix(
            self.conversation_id, through, replacement, expected_revision=expected_revision
        )

    def reset_context(self, ids: Sequence[int] = ()) -> None:
        self.tx.reset_context(self.conversation_id, ids)

    def snapshot(self) -> ConversationSnapshot | None:
        return self.tx.get_conversation(self.conversation_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tx, name)
