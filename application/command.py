"""The command builder: read committed state, allocate ids, buffer validated mutations.

A builder sees pre-command committed state; each mutation is validated against committed
state plus the earlier mutations of the same batch, and receives its final sequence number
at once. Nothing is durable, published or returned to other callers until the outer call
persists the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from pico.application.state import (
    Address,
    ConversationList,
    ConversationValue,
    Initialization,
    SessionValue,
    WorkingList,
    WorkingScope,
    WorkingValue,
    scope_of,
)
from pico.domain.conversation import Conversation
from pico.domain.errors import (
    AddressPolicyError,
    CommandRejectedError,
    ExchangeSplitError,
    InvalidArgumentError,
    InvalidJsonError,
    InvalidPositionError,
    LiveWorkError,
    RequestKeyConflictError,
    TaskDefinitionError,
    TaskGraphError,
    TerminalTaskError,
    UnknownConversationError,
    UnknownEntryError,
    UnknownTaskError,
    WorkingScopeError,
)
from pico.domain.exchange import EntryRef
from pico.domain.ids import (
    MAX_ID,
    check_id,
    check_ids,
    check_optional_id,
    check_optional_position,
)
from pico.domain.json import JsonValue, check_json, check_name, dumps, loads
from pico.domain.session import Session
from pico.domain.state import (
    REQUEST_INPUT_NAMESPACE,
    RESERVED_PREFIX,
    SESSION_SCOPE,
    StateWrite,
    check_namespace,
    conversation_scope,
)
from pico.domain.task import Task
from pico.domain.values import (
    ConversationSnapshot,
    Entry,
    ListElement,
    Order,
    Page,
    StoredValue,
    TaskSnapshot,
    ValuePage,
)

if TYPE_CHECKING:
    from pico.application.line import CommandLine
    from pico.application.tasks import TaskDefinition

__all__ = ["UNSET", "Command", "ConversationCommand", "WorkingCommand"]


class _Unset:
    """Marks an argument the caller did not pass (distinct from None)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()

T = TypeVar("T")


class Command:
    """The mutation vocabulary of §7.4 plus read-only committed queries."""

    def __init__(self, line: CommandLine, *, working: WorkingScope | None = None) -> None:
        self._line = line
        self._reads = line.storage.reads
        self._state = line.storage.state
        self._allocated = 0
        self._first: int | None = None
        self._entries: dict[int, EntryRef] = {}
        self.touched: dict[int, Conversation] = {}
        self.touched_tasks: dict[int, Task] = {}
        self._tasks = line.storage.tasks
        self._sealed = False
        self.working = working
        #: The task whose execution runs this command (None: a caller's command).
        self.task: int | None = None
        self.working_writes: list[StateWrite] = []
        # Session mutations are applied to the Session aggregate only at persist time, so a
        # failed builder leaves its version (the writer fence) untouched.
        self.session_ops: list[Callable[[Session], None]] = []
        #: Address policies this command read or establishes (the line keeps those of
        #: committed commands: a policy never changes once established).
        self.policies: dict[tuple[str, str, str, str], bool] = {}
        self._request_keys: dict[str, str] = {}
        self._core = False

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

    def _main_only(self, what: str) -> None:
        if self.working is not None:
            raise WorkingScopeError(
                f"{what} is a main mutation; this command writes only working scope "
                f"{self.working.name!r}. Use a separate main command"
            )

    def _conversation(self, conversation_id: int) -> Conversation:
        if not (type(conversation_id) is int and 0 < conversation_id <= MAX_ID):
            check_id(conversation_id, "conversation_id")  # raises (inline: ~2 a mutation)
        conv = self.touched.get(conversation_id)
        if conv is None:
            conv = self._line.load_conversation(conversation_id)
        return conv

    def _refs(self, ids: Sequence[int]) -> dict[int, EntryRef]:
        """EntryRefs of ``ids``, which every caller has already checked (its public
        argument, or ids read from the store): one check per argument."""
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
        self._main_only("create_conversation")
        check_optional_id(owner_task_id, "owner_task_id")
        seq = self._peek()
        conv = Conversation.start(
            session_id=self._line.session_id,
            conversation_id=seq,
            owner_task_id=owner_task_id,
        )
        self._alloc()
        self.touched[seq] = conv
        return seq

    def fork(
        self,
        source_id: int,
        *,
        at_entry: int | None = None,
        as_of: int | None = None,
        sticky: Initialization | Sequence[ConversationValue[Any]] = (),
        inherit_state: bool = True,
    ) -> int:
        """Create a historical fork of ``source_id`` after a complete main commit (§3.3).

        Rewindable conversation state is inherited through the boundary without copying
        (unless ``inherit_state=False``); session state is shared and working state is never
        inherited (§4.3). ``sticky`` initializes sticky conversation values: the CURRENT
        source contents of ``inherit`` are copied (a selected absent value stays absent),
        then the ``set`` overrides are applied; unselected sticky values are absent in the
        fork. A plain list of addresses means ``Initialization(inherit=that)``. All of it is
        this one command.
        """
        self._main_only("fork")
        init = Initialization.of(sticky)
        for address in init.addresses:
            if address.rewind:
                raise AddressPolicyError(
                    f"{address.namespace!r} is a rewindable conversation value: a fork "
                    "inherits it through the boundary, so it cannot be selected or "
                    "overridden as sticky state. Set it on the fork afterwards (or in the "
                    "same harness.command, after tx.fork)"
                )
        check_id(source_id, "conversation_id")
        check_optional_id(at_entry, "at_entry")
        check_optional_position(as_of, "as_of")
        if type(inherit_state) is not bool:
            raise InvalidArgumentError(
                f"inherit_state must be True or False, got {inherit_state!r}"
            )
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
                inherit_state=inherit_state,
                context=context,
                refs=refs,
            )
        except ExchangeSplitError as exc:
            raise InvalidPositionError(
                f"cannot fork conversation {source_id} at {position}: {exc}"
            ) from exc
        self._alloc()
        self.touched[seq] = conv
        self._initialize(source_id, seq, init)
        return seq

    def _initialize(self, source_id: int, target_id: int, init: Initialization) -> None:
        """§4.3: copy the selected values' CURRENT source contents into ``target_id`` (a
        selected absent value stays absent; each is read as the source sees it, through
        its own rewind policy), then apply the overrides. A copy, not a live link."""
        overridden = {(a.namespace, a.storage_key) for a, _ in init.set}
        for address in init.inherit:
            if (address.namespace, address.storage_key) in overridden:
                continue  # the override is applied below; the copy would be overwritten
            current = self._state.get_value(
                conversation_scope(source_id),
                address.namespace,
                address.storage_key,
                rewind=address.rewind,
            )
            if current is not None:
                address.decode(current[1])  # copy through the selected type, or refuse
                self._write(address, "set", current[1], conversation_id=target_id)
        for address, text in init.overrides:
            self._write(address, "set", text, conversation_id=target_id)

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
        self._main_only("append_entry")
        text = dumps(content, what="entry content")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidJsonError(
                f"entry metadata: {type(metadata).__name__} is not a JSON object; pass a dict "
                "with string keys, or None"
            )
        meta_text = None if metadata is None else dumps(dict(metadata), what="entry metadata")
        if key is not None and type(key) is not str:
            raise InvalidArgumentError(f"an entry key must be a string or None, got {key!r}")
        if not isinstance(kind, str) or not kind:
            raise InvalidArgumentError(
                f"an entry kind must be a non-empty string (e.g. 'user'), got {kind!r}"
            )
        check_name(kind, what="entry kind")  # kind and key are stored text: the names' gate
        if key is not None:
            check_name(key, what="entry key")
        check_optional_id(by_task_id, "by_task_id")
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
        self._main_only("append_context")
        ids = check_ids(ids, "entry ids")
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
        self._main_only("replace_context_prefix")
        check_id(through, "through")
        if expected_revision is not None and not (
            type(expected_revision) is int and 0 <= expected_revision <= MAX_ID
        ):
            raise InvalidArgumentError(
                "expected_revision must be a prefix revision (an integer from 0, read from "
                f"conversation.snapshot().prefix_revision) or None, got {expected_revision!r}"
            )
        replacement = check_ids(replacement, "replacement")
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
        self._main_only("reset_context")
        ids = check_ids(ids, "entry ids")
        conv = self._conversation(conversation_id)
        refs = self._refs(ids)
        conv.reset_context(seq=self._peek(), ids=ids, refs=refs)
        self._alloc()
        self.touched[conversation_id] = conv

    def delete_conversation(self, conversation_id: int) -> None:
        self._main_only("delete_conversation")
        check_id(conversation_id, "conversation_id")
        if conversation_id == self._line.session.root_id:
            raise CommandRejectedError(
                f"conversation {conversation_id} is the session's root and cannot be deleted"
            )
        conv = self._conversation(conversation_id)
        conv.check_accepts_work()
        self._check_no_live_work(conversation_id)
        conv.delete(seq=self._peek())
        self._alloc()
        self.touched[conversation_id] = conv

    # ------------------------------------------------------------------ scoped state (§4)
    def _write(
        self,
        address: Address[Any],
        op: str,
        text: str | None,
        *,
        conversation_id: int | None = None,
    ) -> int:
        scope = scope_of(address, conversation_id)
        check_namespace(address.namespace, core=self._core)
        key = address.storage_key
        if isinstance(address, WorkingValue):
            if self.working is None:
                raise WorkingScopeError(
                    f"{address.namespace!r} is in working scope {address.scope.name!r}; "
                    "working writes need their own command: "
                    "harness.command(scope, builder)"
                )
            if address.scope != self.working:
                raise WorkingScopeError(
                    f"this command writes working scope {self.working.name!r}, not "
                    f"{address.scope.name!r}: one command writes at most one working scope"
                )
        elif self.working is not None:
            self._main_only(f"writing {address.namespace!r}")
        policy = (address.scope_kind, address.kind, address.namespace, key)
        established = self.policies.get(policy)
        if established is None:
            established = self._line.policies.get(policy)
        if established is None:
            established = self._state.address_policy(*policy)
        if established is not None and established != address.rewind:
            raise AddressPolicyError(
                f"{address.scope_kind} {address.kind} {address.namespace!r} was established "
                f"with rewind={established}; changing it to rewind={address.rewind} is not "
                "an implicit migration. Use a new namespace"
            )
        conv = None
        if conversation_id is not None:
            conv = self._conversation(conversation_id)
        seq = self._peek()
        ns = address.namespace
        if isinstance(address, WorkingValue):
            self.working_writes.append(StateWrite(scope, op, seq, ns, key, text))  # type: ignore[arg-type]
        elif conv is not None:
            rewind = address.rewind
            if op == "set":
                assert text is not None
                conv.set_value(seq=seq, namespace=ns, key=key, value=text, rewind=rewind)
            elif op == "delete":
                conv.delete_value(seq=seq, namespace=ns, key=key, rewind=rewind)
            elif op == "append":
                assert text is not None
                conv.append_list(seq=seq, namespace=ns, key=key, value=text, rewind=rewind)
            else:
                conv.clear_list(seq=seq, namespace=ns, key=key, rewind=rewind)
            self.touched[conv.conversation_id] = conv
        else:
            self.session_ops.append(_session_write(op, seq, ns, key, text))
        self._alloc()
        self.policies[policy] = address.rewind
        return seq

    def made_here(self, address: Address[Any], position: int) -> None:
        """For pico's built-in flows: ``address`` (in a reserved ``pico.`` namespace) is
        keyed by ``position``, which this command allocated, so no earlier command wrote
        it and this command's write establishes its rewind policy: nothing to read from
        the store (on SQLite a read transaction). Any other position changes nothing: the
        write reads the policy as usual."""
        first, last = self._first, self.last
        if (
            first is not None
            and last is not None
            and first <= position <= last
            and address.namespace.startswith(RESERVED_PREFIX)
        ):
            policy = (address.scope_kind, address.kind, address.namespace, address.storage_key)
            self.policies.setdefault(policy, address.rewind)

    @staticmethod
    def _kind(address: Address[Any], kind: str, what: str) -> None:
        if address.kind != kind:
            raise AddressPolicyError(
                f"{what} needs a {kind} address; {address.namespace!r} is a {address.kind}"
            )

    def set_value(
        self, address: Address[T], value: T, *, conversation_id: int | None = None
    ) -> None:
        self._kind(address, "value", "set_value")
        self._write(address, "set", address.encode(value), conversation_id=conversation_id)

    def delete_value(self, address: Address[Any], *, conversation_id: int | None = None) -> None:
        """Delete a value; for a rewindable value this records absence (a fork before the
        delete still sees the old value, one after it sees none)."""
        self._kind(address, "value", "delete_value")
        self._write(address, "delete", None, conversation_id=conversation_id)

    def append_list(
        self, address: Address[T], value: T, *, conversation_id: int | None = None
    ) -> int:
        """Append to a list; returns the element id (its sequence number, the cursor)."""
        self._kind(address, "list", "append_list")
        return self._write(
            address, "append", address.encode(value), conversation_id=conversation_id
        )

    def clear_list(self, address: Address[Any], *, conversation_id: int | None = None) -> None:
        self._kind(address, "list", "clear_list")
        self._write(address, "clear", None, conversation_id=conversation_id)

    def get_stored(
        self,
        address: Address[T],
        *,
        conversation_id: int | None = None,
        as_of: int | None = None,
    ) -> StoredValue[T] | None:
        """The committed value with the seq that set it; None means absent (JSON null is
        a stored value)."""
        self._kind(address, "value", "get_value")
        scope = scope_of(address, conversation_id)
        found = self._state.get_value(
            scope, address.namespace, address.storage_key, rewind=address.rewind, as_of=as_of
        )
        return None if found is None else StoredValue(found[0], address.decode(found[1]))

    def get_value(
        self,
        address: Address[T],
        *,
        conversation_id: int | None = None,
        as_of: int | None = None,
        default: T | None = None,
    ) -> T | None:
        stored = self.get_stored(address, conversation_id=conversation_id, as_of=as_of)
        return default if stored is None else stored.value

    def read_list(
        self,
        address: Address[T],
        *,
        conversation_id: int | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        as_of: int | None = None,
    ) -> Page[ListElement[T]]:
        self._kind(address, "list", "read_list")
        scope = scope_of(address, conversation_id)
        page = self._state.read_list(
            scope,
            address.namespace,
            address.storage_key,
            rewind=address.rewind,
            after=after,
            before=before,
            order=order,
            limit=limit,
            as_of=as_of,
        )
        items = tuple(ListElement(i, address.decode(text)) for i, text in page.items)
        return Page(items, page.as_of, page.next)

    def scan_values(
        self,
        *,
        conversation_id: int | None = None,
        working: WorkingScope | None = None,
        namespace: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> ValuePage:
        """Current values of one scope (session by default), ordered by address key.
        Rewindable conversation values are historical: read them per address."""
        if working is not None:
            scope = working.scope_id
        elif conversation_id is not None:
            scope = conversation_scope(conversation_id)
        else:
            scope = SESSION_SCOPE
        return self._state.scan_values(scope, namespace=namespace, after=after, limit=limit)

    def values_under(self, conversation_id: int, prefix: str) -> list[tuple[str, str, int, str]]:
        """Every current value of a conversation's scope whose namespace starts with
        ``prefix``, in (namespace, key) order, as (namespace, key, seq, JSON text): the
        input queues (``flows/inputs.py``), read at every placement."""
        return self._state.values_under(conversation_scope(conversation_id), prefix)

    def retire_working_scope(self, scope: WorkingScope) -> None:
        """End a working scope's lifetime (a main mutation). Its contents become invisible
        and storage reclaims them in this commit; the name can start a fresh lifetime."""
        self._main_only("retire_working_scope")
        seq = self._peek()
        sid = scope.scope_id
        self.session_ops.append(lambda s: s.retire_working_scope(seq=seq, scope=sid))
        self._alloc()

    def start_chain(self, *, anchor: str, events: int) -> None:
        """Record the anchor of a session written before the hash chain (a main
        mutation): ``Session.ChainStarted`` with the chain recomputed over its ``events``
        stored events, so a later change to that history is found by verification."""
        self._main_only("start_chain")
        seq = self._peek()
        self.session_ops.append(lambda s: s.start_chain(seq=seq, anchor=anchor, events=events))
        self._alloc()

    def change_configuration(
        self, fingerprint: dict[str, Any], changes: list[dict[str, Any]], *, acknowledged: bool
    ) -> None:
        """The resume gate (``gate.py``, a main mutation): ``Session.ConfigurationChanged``."""
        self._main_only("change_configuration")
        seq = self._peek()
        self.session_ops.append(
            lambda s: s.change_configuration(
                seq=seq, fingerprint=fingerprint, changes=changes, acknowledged=acknowledged
            )
        )
        self._alloc()

    # ------------------------------------------------------------------ tasks (§5, §6.1)
    def _task(self, task_id: int) -> Task:
        if not (type(task_id) is int and 0 < task_id <= MAX_ID):
            check_id(task_id, "task_id")  # raises (inline, as in _conversation)
        task = self.touched_tasks.get(task_id)
        if task is None:
            task = self._line.load_task(task_id)
        return task

    def _task_facts(self, ids: Sequence[int]) -> dict[int, tuple[int, list[int]]]:
        """(conversation, after) of tasks, batch-local first, then one batched read."""
        out = {
            i: (t.conversation_id, list(t.after)) for i, t in self.touched_tasks.items() if i in ids
        }
        missing = [i for i in ids if i not in out]
        if missing:
            for i, snap in self._tasks.get_tasks(missing).items():
                out[i] = (snap.conversation_id, list(snap.after))
        return out

    def _tree_root(self, conversation_id: int) -> int:
        """The root conversation of a conversation's execution-ownership tree."""
        seen: set[int] = set()
        conv = conversation_id
        while conv not in seen:
            seen.add(conv)
            created = self.touched.get(conv)
            if created is not None:
                owner = created.owner_task_id
            else:
                owner = self._reads.owners([conv]).get(conv)
            if owner is None:
                return conv
            conv = self._task_facts([owner]).get(owner, (conv, []))[0]
        return conv

    def _check_dependencies(
        self, task_id: int | None, conversation_id: int, after: Sequence[int]
    ) -> None:
        if not after:
            return
        facts = self._task_facts(list(after))
        for dep in after:
            if dep not in facts:
                raise UnknownTaskError(dep, " (named in after=)")
        root = self._tree_root(conversation_id)
        for dep in after:
            if self._tree_root(facts[dep][0]) != root:
                raise TaskGraphError(
                    f"task {dep} belongs to another execution-ownership tree; dependencies "
                    "stay within one tree (a fork does not make work runnable elsewhere)"
                )
        if task_id is None:
            return  # a new task depends only on existing tasks: no cycle possible
        frontier, seen = list(after), set()
        while frontier:  # walk the dependency graph reachable from the new edges
            if task_id in frontier:
                raise TaskGraphError(
                    f"making task {task_id} wait for {list(after)} would create a dependency "
                    "cycle; dependencies must stay acyclic"
                )
            seen.update(frontier)
            nxt: list[int] = []
            for _, deps in self._task_facts(frontier).values():
                nxt.extend(d for d in deps if d not in seen)
            frontier = nxt

    def create_task(
        self,
        conversation_id: int,
        kind: str,
        *,
        state: JsonValue = None,
        status: str | None = None,
        after: Sequence[int] = (),
        foreground: bool = False,
        spawned_by: int | None = None,
        not_before: float | None = None,
        required_permit: str | None = None,
    ) -> int:
        """Create durable work in a conversation; returns its id. Nothing runs until a
        covering drive claims it (§1.3)."""
        self._main_only("create_task")
        definition = self._line.definitions.get(kind)
        status = definition.initial_status if status is None else status
        role = definition.role_of(status)
        text = _task_state(definition, None, state)
        conv = self._conversation(conversation_id)
        conv.check_accepts_work()
        after = check_ids(after, "after")
        check_optional_id(spawned_by, "spawned_by")
        _check_schedule(not_before, required_permit)
        if type(foreground) is not bool:
            raise InvalidArgumentError(f"foreground must be True or False, got {foreground!r}")
        self._check_dependencies(None, conversation_id, after)
        if spawned_by is not None:
            marked = self.abort_marked(spawned_by)
            if marked is None:
                raise UnknownTaskError(spawned_by, " (named in spawned_by=)")
            if marked:
                raise TaskGraphError(
                    f"task {spawned_by} is marked for cancellation; it cannot create normal "
                    "successors (§6.4)"
                )
        self._check_owners_unmarked(conversation_id)
        seq = self._peek()
        task = Task.start(
            session_id=self._line.session_id,
            task_id=seq,
            conversation_id=conversation_id,
            kind=kind,
            status=status,
            role=role,
            state=text,
            after=after,
            foreground=bool(foreground),
            spawned_by=spawned_by,
            not_before=None if not_before is None else float(not_before),
            required_permit=required_permit,
        )
        self._alloc()
        self.touched_tasks[seq] = task
        return seq

    def patch_task(
        self,
        task_id: int,
        *,
        status: str | None = None,
        state: JsonValue | _Unset = UNSET,
        after: Sequence[int] | None = None,
        not_before: float | _Unset | None = UNSET,
        required_permit: str | _Unset | None = UNSET,
    ) -> None:
        """Move a task to a new status (role derived by its definition), optionally with new
        state, dependencies and scheduling fields. Terminal tasks accept no patch."""
        self._main_only("patch_task")
        task = self._task(task_id)
        if task.terminal:
            raise TerminalTaskError(task_id, task.status)
        definition = self._line.definitions.get(task.kind)
        new_status = task.status if status is None else status
        role = definition.role_of(new_status, task_id=task_id)
        definition.check_transition(task_id, task.status, new_status)
        text = None
        if not isinstance(state, _Unset):
            text = _task_state(definition, task_id, state)
        new_after = list(task.after) if after is None else check_ids(after, "after")
        _check_schedule(
            None if isinstance(not_before, _Unset) else not_before,
            None if isinstance(required_permit, _Unset) else required_permit,
        )
        if after is not None:
            self._check_dependencies(task_id, task.conversation_id, new_after)
        task.patch(
            seq=self._peek(),
            status=new_status,
            role=role,
            state=text,
            after=new_after,
            not_before=task.not_before
            if isinstance(not_before, _Unset)
            else (None if not_before is None else float(not_before)),
            required_permit=task.required_permit
            if isinstance(required_permit, _Unset)
            else required_permit,
        )
        self._alloc()
        self.touched_tasks[task_id] = task

    def request_abort(self, task_id: int) -> bool:
        """Durably mark a live task for cancellation (§6.4); False if terminal or marked."""
        self._main_only("request_abort")
        task = self._task(task_id)
        if not task.request_abort(seq=self._peek()):
            return False
        self._alloc()
        self.touched_tasks[task_id] = task
        return True

    def create_owned_conversation(
        self,
        owner_task_id: int,
        *,
        context: Sequence[int] = (),
        values: Initialization | None = None,
        values_from: int | None = None,
    ) -> int:
        """A child conversation owned by a task; both links commit together (§5.7).

        ``context`` starts the child with those entries selected (an inherited context:
        complete exchanges only; the entries stay where they are, nothing is copied).
        ``values`` initializes the child's conversation values from ``values_from`` (the
        owner's conversation by default): selected present values copied, then the
        overrides (§4.3). This is initialization, not a historical fork: the child has no
        fork source and no fallback to the parent's state."""
        self._main_only("create_owned_conversation")
        context = check_ids(context, "context")
        owner = self._task(owner_task_id)
        if owner.abort_requested:
            raise TaskGraphError(
                f"task {owner_task_id} is marked for cancellation; it cannot create owned children"
            )
        if owner.terminal:
            raise TerminalTaskError(owner_task_id, owner.status)
        init = None if values is None else Initialization.of(values)
        source = owner.conversation_id if values_from is None else values_from
        refs = self._refs(list(context))
        conversation_id = self._peek()
        try:
            conv = Conversation.start(
                session_id=self._line.session_id,
                conversation_id=conversation_id,
                owner_task_id=owner_task_id,
                context=context,
                refs=refs,
            )
        except ExchangeSplitError as exc:
            raise InvalidPositionError(
                f"cannot start a child conversation with that context: {exc}"
            ) from exc
        self._alloc()
        self.touched[conversation_id] = conv
        owner.link_owned_conversation(seq=self._peek(), conversation_id=conversation_id)
        self._alloc()
        self.touched_tasks[owner_task_id] = owner
        if init is not None:
            self._initialize(source, conversation_id, init)
        return conversation_id

    def _check_owners_unmarked(self, conversation_id: int) -> None:
        """§6.4: no new work starts beneath an owner marked for cancellation, however deep
        (a spawn or an input inside its child, say). Unowned conversations read nothing."""
        conv: int | None = conversation_id
        while conv is not None:
            owner_id = self.owner_of(conv)
            if owner_id is None:
                return
            owner = self._task(owner_id)  # the line's cached aggregate, or one load
            if owner.abort_requested and not owner.terminal:  # a settled owner is history
                raise TaskGraphError(
                    f"conversation {conversation_id} is owned (through conversation {conv}) "
                    f"by task {owner_id}, which is marked for cancellation: no new work "
                    "starts beneath it until the cancellation settles (§6.4); drive the "
                    "session, then try again"
                )
            conv = owner.conversation_id

    def owner_of(self, conversation_id: int) -> int | None:
        """The task owning ``conversation_id`` (§5.7), None for an unowned one; read from
        the conversation aggregate the line keeps, so a routine boundary reads nothing."""
        return self._conversation(conversation_id).owner_task_id

    def get_task(self, task_id: int) -> TaskSnapshot | None:
        return self._tasks.get_tasks([task_id]).get(task_id)

    def get_tasks(self, ids: Sequence[int]) -> dict[int, TaskSnapshot]:
        """Committed task records by id, in one read (unknown ids are absent)."""
        return self._tasks.get_tasks(ids)

    def abort_marked(self, task_id: int) -> bool | None:
        """Is the task marked for cancellation (§6.4), with this batch's own marks; None
        for an unknown task. Answered from the line's cached aggregate when it has one (it
        is the only writer), else by one read."""
        check_id(task_id, "task_id")
        task = self.touched_tasks.get(task_id) or self._line.cached_task(task_id)
        if task is not None:
            return task.abort_requested
        found = self.get_task(task_id)
        return None if found is None else found.abort_requested

    def scan_tasks(self, **query: Any) -> Page[TaskSnapshot]:
        return self._tasks.scan_tasks(**query)

    def _check_no_live_work(self, conversation_id: int) -> None:
        """§6.6: a conversation whose ownership subtree has live work cannot be deleted."""
        for task in self.touched_tasks.values():
            if task.conversation_id == conversation_id and not task.terminal:
                raise LiveWorkError(
                    f"conversation {conversation_id} has live task {task.task_id} in this "
                    "command; settle or abort it before deleting the conversation"
                )
        frontier, seen = [conversation_id], set()
        while frontier:
            conv = frontier.pop()
            if conv in seen:
                continue
            seen.add(conv)
            live = self._tasks.scan_tasks(conversation_ids=[conv], live=True, limit=1).items
            if live:
                where = "" if conv == conversation_id else f" (in owned conversation {conv})"
                raise LiveWorkError(
                    f"conversation {conversation_id} has live task {live[0].id}{where}; abort "
                    "or settle its work before deleting it"
                )
            frontier.extend(self._tasks.owned_conversations(conv))

    @contextmanager
    def core(self) -> Iterator[None]:
        """For pico's built-in flows only: allow writes to reserved ``pico.`` namespaces."""
        previous, self._core = self._core, True
        try:
            yield
        finally:
            self._core = previous

    # ------------------------------------------------------------------ request keys (§3.6)
    def claim_request_key(
        self, key: str, *, conversation_id: int, fingerprint: str, create: Callable[[], int]
    ) -> tuple[int, bool]:
        """Map a caller's request key to an id inside this command.

        Returns ``(id, False)`` when the key already maps to an equivalent request, or
        calls ``create`` and records ``(id, True)``. Reusing a key for another
        conversation or a different request rejects.
        """
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"a request key must be a non-empty string, got {key!r}")
        check_name(key, what="request key")
        text = self._request_keys.get(key)
        if text is None:
            found = self._state.get_value(SESSION_SCOPE, REQUEST_INPUT_NAMESPACE, key, rewind=False)
            text = None if found is None else found[1]
        if text is not None:
            mapping = loads(text)
            assert isinstance(mapping, dict)
            if mapping.get("conversation_id") != conversation_id:
                raise RequestKeyConflictError(
                    key, f"for conversation {mapping.get('conversation_id')}"
                )
            if mapping.get("fingerprint") != fingerprint:
                raise RequestKeyConflictError(key, "for a different request")
            existing = mapping.get("id")
            assert isinstance(existing, int)
            return existing, False
        new_id = create()
        payload = dumps(
            {"id": new_id, "conversation_id": conversation_id, "fingerprint": fingerprint}
        )
        self._core = True  # the mapping is core-owned (see core())
        try:
            self._write(_REQUEST_KEYS.with_key(key), "set", payload)
        finally:
            self._core = False
        self._request_keys[key] = payload
        return new_id, True


def _task_state(definition: TaskDefinition, task_id: int | None, state: JsonValue) -> str:
    """The definition's state through the gate. A definition that refuses a value which is
    not JSON anyway gets the gate's verdict (InvalidJsonError naming the path), not its
    own; valid state is walked once."""
    try:
        checked = definition.check_state(task_id, state)
    except TaskDefinitionError:
        check_json(state, what="task state")
        raise
    return dumps(checked, what="task state")


def _check_schedule(not_before: object, required_permit: object) -> None:
    if not_before is not None and not (
        type(not_before) in (int, float) and math.isfinite(not_before)  # type: ignore[arg-type]
    ):
        raise InvalidArgumentError(
            "not_before must be a finite number of seconds on the harness clock, or None; "
            f"got {not_before!r}"
        )
    if required_permit is not None:
        if type(required_permit) is not str:
            raise InvalidArgumentError(
                f"required_permit must be a permit name (a string) or None, got {required_permit!r}"
            )
        check_name(required_permit, what="required_permit")


def _session_write(
    op: str, seq: int, namespace: str, key: str, text: str | None
) -> Callable[[Session], None]:
    def apply(session: Session) -> None:
        if op == "set":
            assert text is not None
            session.set_value(seq=seq, namespace=namespace, key=key, value=text)
        elif op == "delete":
            session.delete_value(seq=seq, namespace=namespace, key=key)
        elif op == "append":
            assert text is not None
            session.append_list(seq=seq, namespace=namespace, key=key, value=text)
        else:
            session.clear_list(seq=seq, namespace=namespace, key=key)

    return apply


class _RequestKeys(SessionValue[Any]):
    def with_key(self, key: str) -> SessionValue[Any]:
        return SessionValue(namespace=self.namespace, key=key)


_REQUEST_KEYS = _RequestKeys(namespace=REQUEST_INPUT_NAMESPACE)


class WorkingCommand:
    """A command that writes exactly one working scope: value/list writes only (§9.2)."""

    def __init__(self, tx: Command) -> None:
        self.tx = tx
        assert tx.working is not None
        self.scope = tx.working

    def set_value(self, address: WorkingValue[T], value: T) -> None:
        self.tx.set_value(address, value)

    def delete_value(self, address: WorkingValue[Any]) -> None:
        self.tx.delete_value(address)

    def append_list(self, address: WorkingList[T], value: T) -> int:
        return self.tx.append_list(address, value)

    def clear_list(self, address: WorkingList[Any]) -> None:
        self.tx.clear_list(address)

    def get_value(self, address: WorkingValue[T], default: T | None = None) -> T | None:
        return self.tx.get_value(address, default=default)

    def read_list(
        self, address: WorkingList[T], *, after: int | None = None, limit: int = 100
    ) -> Page[ListElement[T]]:
        return self.tx.read_list(address, after=after, limit=limit)


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

    def set_value(self, address: ConversationValue[T], value: T) -> None:
        self.tx.set_value(address, value, conversation_id=self.conversation_id)

    def delete_value(self, address: ConversationValue[Any]) -> None:
        self.tx.delete_value(address, conversation_id=self.conversation_id)

    def append_list(self, address: ConversationList[T], value: T) -> int:
        return self.tx.append_list(address, value, conversation_id=self.conversation_id)

    def clear_list(self, address: ConversationList[Any]) -> None:
        self.tx.clear_list(address, conversation_id=self.conversation_id)

    def get_value(
        self,
        address: ConversationValue[T],
        *,
        as_of: int | None = None,
        default: T | None = None,
    ) -> T | None:
        return self.tx.get_value(
            address, conversation_id=self.conversation_id, as_of=as_of, default=default
        )

    def read_list(
        self,
        address: ConversationList[T],
        *,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        as_of: int | None = None,
    ) -> Page[ListElement[T]]:
        return self.tx.read_list(
            address,
            conversation_id=self.conversation_id,
            after=after,
            before=before,
            order=order,
            limit=limit,
            as_of=as_of,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tx, name)
