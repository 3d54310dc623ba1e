"""Watching a conversation's committed state without gaps (§9.4).

``harness.watch(conversation_id, listener)`` runs ONE serialized step: it makes every
saved command durable, captures the observation boundary (the newest stored event's
position and the main head), reads the base — the conversation, its newest transcript
page, the admission entries its visible placements refer to, its live tasks, its queued
inputs and the working previews of those tasks — and registers the binding. No await
separates the read from the registration, and every in-process commit is published in a
step of its own, so a racing commit is either in the base or delivered after it, never
neither and never both.

Then each durable main commit that touches the conversation is delivered whole, as ONE
``WatchCommit`` ``{first_seq, last_seq, changes}`` (filtering drops the changes of other
conversations, never splits a batch); a working commit of one of its tasks is a
``WatchPreview`` ``{task_id, kind, value}`` with the frames it added; ``WatchSignal``
says ``idle`` (the conversation's last live task settled, judged after whole batches, so a
task and the successor created with its settlement never look idle), ``fault`` (the
handle faulted: rebind on a new handle), ``handler_error`` (the listener raised; the
commit stays committed) and ``rebind`` (the consumer fell more than ``buffer`` events
behind: the binding is retired and delivers nothing more; watch again for a fresh base).

The owner's own handle delivers its batches from the committed events themselves (kept
from save until durable; nothing is read back). A watcher on another handle — a read-only
one, in this process or another — reads the owner's batches back from storage by position
(the audit reader), polling the newest stored position (one index seek) every
``poll_interval`` seconds, woken early where the storage can notify (PostgreSQL).
``closed`` tells a binding its handle closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pico.application.audit import JSON_TEXT_FIELDS
from pico.application.events import aggregate_name, event_payload
from pico.application.flows.inputs import MODES
from pico.application.ports import AuditRecord
from pico.domain.errors import InvalidArgumentError, UnknownConversationError
from pico.domain.ids import check_id, check_limit
from pico.domain.json import JsonObject, JsonValue, loads
from pico.domain.state import conversation_scope, working_scope_id
from pico.domain.values import ConversationSnapshot, Entry, TaskSnapshot

if TYPE_CHECKING:
    from pico.application.line import CommandLine

__all__ = [
    "PREVIEW_LISTS",
    "WatchBase",
    "WatchChange",
    "WatchCommit",
    "WatchEvent",
    "WatchHub",
    "WatchPreview",
    "WatchSignal",
    "WatchStream",
    "conversation_json",
    "entry_json",
    "task_json",
]

#: The working lists a watch previews by default: a generation's streamed text frames and
#: a tool's progress output.
PREVIEW_LISTS = ("pico.frames", "pico.tool-output")
#: The most transcript entries a base holds, and events a slow consumer may fall behind.
MAX_WATCH_LIMIT = 1000
MAX_WATCH_BUFFER = 1_000_000
#: Stored events read per query while catching up.
_READ_PAGE = 500
_QUEUE = "pico.queue."


@dataclass(frozen=True)
class _Record:
    """One event of a batch: read back from storage (with its position) or taken from the
    command that just committed it (position None)."""

    position: int | None
    aggregate: str
    event: str
    payload: JsonObject


@dataclass(frozen=True)
class WatchChange:
    """One event of a delivered batch, as the audit reader shows it. ``position`` is its
    stored position when the watcher read it back from storage (another handle's
    commits); None when delivered by the owner's own handle, which never reads back."""

    position: int | None
    aggregate: str  # "conversation/<id>", "task/<id>" or "session"
    event: str  # e.g. "Conversation.EntryAppended"
    payload: JsonObject

    def to_json(self) -> JsonObject:
        return {
            "position": self.position,
            "aggregate": self.aggregate,
            "event": self.event,
            "payload": self.payload,
        }


@dataclass(frozen=True)
class WatchPreview:
    """Frames a task's working commit added to one of its preview lists."""

    task_id: int
    kind: str  # the working list, e.g. "pico.frames"
    value: tuple[JsonValue, ...]
    position: int | None

    def to_json(self) -> JsonObject:
        return {
            "type": "preview",
            "task_id": self.task_id,
            "kind": self.kind,
            "value": list(self.value),
            "position": self.position,
        }


@dataclass(frozen=True)
class WatchBase:
    """What the binding starts from, read in the registering step. ``as_of`` is the main
    head it reflects; ``position`` the stored event the stream continues after."""

    conversation: ConversationSnapshot
    entries: tuple[Entry, ...]  # the newest ``limit``, oldest first
    referenced_inputs: dict[int, Entry]  # admission entries of visible placements
    tasks: tuple[TaskSnapshot, ...]  # the conversation's live tasks
    queued: tuple[tuple[int, str], ...]  # (input id, mode), in admission order
    previews: tuple[WatchPreview, ...]
    as_of: int
    position: int

    def to_json(self) -> JsonObject:
        return {
            "type": "base",
            "conversation": conversation_json(self.conversation),
            "entries": [entry_json(e) for e in self.entries],
            "referenced_inputs": {str(k): entry_json(v) for k, v in self.referenced_inputs.items()},
            "tasks": [task_json(t) for t in self.tasks],
            "queued": [{"input": i, "mode": m} for i, m in self.queued],
            "previews": [p.to_json() for p in self.previews],
            "as_of": self.as_of,
            "position": self.position,
        }


@dataclass(frozen=True)
class WatchCommit:
    """One durable main commit touching the conversation, whole."""

    first_seq: int
    last_seq: int
    changes: tuple[WatchChange, ...]
    position: int | None  # the batch's boundary event, when read back from storage

    def to_json(self) -> JsonObject:
        return {
            "type": "commit",
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "changes": [c.to_json() for c in self.changes],
            "position": self.position,
        }


SignalKind = Literal["idle", "fault", "handler_error", "rebind", "closed"]


@dataclass(frozen=True)
class WatchSignal:
    kind: SignalKind
    detail: str = ""

    def to_json(self) -> JsonObject:
        return {"type": "signal", "kind": self.kind, "detail": self.detail}


WatchEvent: TypeAlias = WatchBase | WatchCommit | WatchPreview | WatchSignal
Listener: TypeAlias = Callable[[WatchEvent], Any]


# The JSON forms of the records a watch base carries (and the inspector serves).


def conversation_json(c: ConversationSnapshot) -> JsonObject:
    return {
        "id": c.id,
        "context": list(c.context),
        "source": None
        if c.source is None
        else {"conversation_id": c.source.conversation_id, "as_of": c.source.as_of},
        "owner_task_id": c.owner_task_id,
        "prefix_revision": c.prefix_revision,
        "inherit_state": c.inherit_state,
        "created_seq": c.created_seq,
        "deleted": c.deleted,
    }


def entry_json(e: Entry) -> JsonObject:
    return {
        "id": e.id,
        "conversation_id": e.conversation_id,
        "kind": e.kind,
        "content": e.content,
        "metadata": e.metadata,
        "key": e.key,
        "by_task_id": e.by_task_id,
        "commit_end": e.commit_end,
    }


def task_json(t: TaskSnapshot) -> JsonObject:
    return {
        "id": t.id,
        "conversation_id": t.conversation_id,
        "kind": t.kind,
        "status": t.status,
        "role": t.role,
        "live": t.live,
        "state": t.state,
        "after": list(t.after),
        "foreground": t.foreground,
        "spawned_by": t.spawned_by,
        "owned_conversation_id": t.owned_conversation_id,
        "not_before": t.not_before,
        "required_permit": t.required_permit,
        "abort_requested": t.abort_requested,
        "updated_seq": t.updated_seq,
    }


@dataclass
class _Binding:
    conversation_id: int
    listener: Listener
    buffer: int
    previews: tuple[str, ...]
    tasks: set[int] = field(default_factory=set)
    live: set[int] = field(default_factory=set)
    list_cursors: dict[tuple[int, str], int] = field(default_factory=dict)
    pending: int = 0  # events handed over whose (async) listener call has not finished
    queue: deque[WatchEvent] | None = None  # set while an async listener call runs
    retired: bool = False
    after: int = 0  # batches read back at or before this position are in its base

    def relevant(self, record: _Record) -> bool:
        aggregate = record.aggregate
        if aggregate == f"conversation/{self.conversation_id}":
            return True
        if aggregate.startswith("task/"):
            task_id = int(aggregate[5:])
            if task_id in self.tasks:
                return True
            if (
                record.event == "Task.Created"
                and record.payload.get("conversation_id") == self.conversation_id
            ):
                self.tasks.add(task_id)
                return True
            return False
        # Session values (input results, session state) are not per conversation: keep
        # them, except the batch boundaries themselves and ownership bookkeeping.
        return aggregate == "session" and record.event not in (
            "Session.Committed",
            "Session.Claimed",
            "Session.ConfigurationRecorded",
            "Session.ConfigurationChanged",
        )


class WatchHub:
    """The bindings of one open handle and the position they have all been given."""

    def __init__(self, line: CommandLine, *, poll_interval: float = 0.2) -> None:
        self.line = line
        self.poll_interval = poll_interval
        self.bindings: list[_Binding] = []
        self.position = 0  # every stored event up to here was delivered
        self._poller: asyncio.Task[None] | None = None
        self._faulted = False
        self._delivering = False
        # Batches this handle saved that are not durable yet: (first, last, scope, events).
        self._saved: list[tuple[int, int, str, list[Any]]] = []
        line.on_durable = self.durable
        line.on_fault = self.fault

    # ------------------------------------------------------------------ registration
    def watch(
        self,
        conversation_id: int,
        listener: Listener,
        *,
        limit: int,
        buffer: int,
        previews: Sequence[str],
    ) -> Callable[[], None]:
        check_id(conversation_id, "conversation_id")
        limit = check_limit(limit, "limit", maximum=MAX_WATCH_LIMIT)
        buffer = check_limit(buffer, "buffer", maximum=MAX_WATCH_BUFFER)
        if not callable(listener):
            raise InvalidArgumentError(
                f"listener must be a callable taking one watch event, got "
                f"{type(listener).__name__}; or call watch() without one for an async iterator"
            )
        if isinstance(previews, str) or not isinstance(previews, Sequence):
            raise InvalidArgumentError(
                f"previews must be a list of working list names (str), got {previews!r}"
            )
        kinds = tuple(previews)
        for kind in kinds:
            if not isinstance(kind, str) or not kind:
                raise InvalidArgumentError(f"previews must name working lists (str), got {kind!r}")
        line = self.line
        line.check_usable()
        if not line.read_only and line.pending:
            line.flush()  # the base must not show a command that is not durable yet
        storage = line.storage
        # ONE step, no await: boundaries, base, registration.
        with storage.snapshot():
            start = storage.last_position()
            if not self.bindings:
                self.position = start
            conversation = storage.reads.get_conversations([conversation_id]).get(conversation_id)
            if conversation is None:
                raise UnknownConversationError(conversation_id)
            binding = _Binding(conversation_id, listener, buffer, kinds)
            # Its base holds every stored batch up to ``start``; a read-only hub whose
            # cursor lags (the poll has not run yet) must not deliver those again to it.
            binding.after = start
            base = self._base(binding, conversation, limit)
        self.bindings.append(binding)
        if not line.read_only:
            line.on_saved = self.saved  # from now on the committed events are kept
        self._deliver(binding, base)
        if line.read_only:
            self._start_polling()

        def unsubscribe() -> None:
            self._retire(binding)

        return unsubscribe

    def _retire(self, binding: _Binding) -> None:
        binding.retired = True
        with contextlib.suppress(ValueError):
            self.bindings.remove(binding)
        if not self.bindings:
            self.line.on_saved = None  # nobody listens: events are not collected
            self._saved.clear()

    def _base(self, binding: _Binding, conversation: ConversationSnapshot, limit: int) -> WatchBase:
        storage = self.line.storage
        reads = storage.reads
        cid = binding.conversation_id
        page = reads.scan_entries(
            cid,
            after=None,
            before=None,
            order="desc",
            limit=limit,
            kind=None,
            key=None,
            as_of=None,
            content=True,
        )
        entries = tuple(reversed(page.items))
        inputs = [
            e.content.get("input")
            for e in entries
            if e.kind == "placement" and isinstance(e.content, dict)
        ]
        wanted = sorted({i for i in inputs if isinstance(i, int)})
        referenced = reads.get_entries(wanted) if wanted else {}
        tasks: list[TaskSnapshot] = []
        after: int | None = None
        while True:
            found = storage.tasks.scan_tasks(
                conversation_ids=[cid], live=True, after=after, limit=500
            )
            tasks.extend(found.items)
            if found.next is None:
                break
            after = found.next
        binding.tasks = {t.id for t in tasks}
        binding.live = set(binding.tasks)
        queued: list[tuple[int, str]] = []
        scope = conversation_scope(cid)
        cursor: tuple[str, str] | None = (_QUEUE, "")
        while cursor is not None:
            values = storage.state.scan_values(scope, after=cursor, limit=500)
            done = False
            for item in values.items:
                if not item.namespace.startswith(_QUEUE):
                    done = True
                    break
                mode = item.namespace[len(_QUEUE) :]
                if mode in MODES:
                    queued.append((int(item.key or 0), mode))
            cursor = None if done else values.next
        previews: list[WatchPreview] = []
        position = self.position
        for task in tasks:
            for kind in binding.previews:
                frames = self._frames(binding, task.id, kind)
                if frames:
                    previews.append(WatchPreview(task.id, kind, frames, position))
        return WatchBase(
            conversation=conversation,
            entries=entries,
            referenced_inputs=referenced,
            tasks=tuple(tasks),
            queued=tuple(sorted(queued)),
            previews=tuple(previews),
            as_of=reads.main_head(),
            position=position,
        )

    def _frames(self, binding: _Binding, task_id: int, kind: str) -> tuple[JsonValue, ...]:
        """The elements a task's working list gained after this binding's cursor."""
        state = self.line.storage.state
        key = (task_id, kind)
        out: list[JsonValue] = []
        after = binding.list_cursors.get(key)
        while True:
            page = state.read_list(
                working_scope_id(f"task/{task_id}"), kind, "", rewind=False, after=after, limit=500
            )
            for seq, text in page.items:
                out.append(loads(text))
                after = seq
            if page.next is None:
                break
        if after is not None:
            binding.list_cursors[key] = after
        return tuple(out)

    # ------------------------------------------------------------------ delivery
    def saved(self, tx: Any, events: list[Any]) -> None:
        """The owner's own command was saved: keep its events until it is durable."""
        scope = "main" if tx.working is None else tx.working.scope_id
        self._saved.append((tx.first, tx.last, scope, events))

    def durable(self) -> None:
        """Everything saved so far is durable: deliver what the bindings have not seen —
        the owner's own batches from the commands themselves (nothing is read back), or,
        on a read-only handle, what another owner stored since the cursor."""
        if not self.bindings or self._delivering:
            self._saved.clear()
            return
        self._delivering = True
        try:
            if self.line.read_only:
                self._catch_up()
                return
            saved, self._saved = self._saved, []
            for first, last, scope, events in saved:
                records = [
                    _Record(None, aggregate_name(e), name, _decoded(name, event_payload(e)))
                    for e in events
                    if (name := type(e).__qualname__) != "Session.Committed"
                ]
                self._dispatch(first, last, scope, records, None)
        finally:
            self._delivering = False

    def _catch_up(self) -> None:
        """Read what another owner stored after the cursor, batch by batch. A batch may
        span pages (a command of thousands of events): its events are kept across pages
        and it is dispatched at its boundary. A claim transaction (``Session.Claimed``,
        stored with no commit boundary) is complete too: the cursor moves past it, so a
        reopen of the owner is not re-read on every poll."""
        storage = self.line.storage
        batch: list[_Record] = []
        after = self.position
        while True:
            records = storage.audit(after=after, limit=_READ_PAGE)
            for record in records:
                if record.event == "Session.Committed":
                    payload = record.payload
                    first, last = payload.get("first"), payload.get("last")
                    assert isinstance(first, int) and isinstance(last, int)
                    scope = str(payload.get("scope"))
                    self._dispatch(first, last, scope, batch, record.position)
                    batch = []
                    self.position = record.position
                elif record.event == "Session.Claimed":
                    batch = []  # an owner's claim: bookkeeping, never delivered
                    self.position = record.position
                else:
                    batch.append(_as_record(record))
            if len(records) < _READ_PAGE:
                return  # caught up; a batch without its boundary is re-read next time
            after = records[-1].position

    def _dispatch(
        self, first: int, last: int, scope: str, batch: list[_Record], position: int | None
    ) -> None:
        for binding in list(self.bindings):
            if binding.retired or (position is not None and position <= binding.after):
                continue
            if scope != "main":
                task = _scope_task(scope)
                if task is None or task not in binding.tasks:
                    continue
                for kind in binding.previews:
                    frames = self._frames(binding, task, kind)
                    if frames:
                        self._deliver(binding, WatchPreview(task, kind, frames, position))
                continue
            changes = tuple(
                WatchChange(r.position, r.aggregate, r.event, r.payload)
                for r in batch
                if binding.relevant(r)
            )
            if not changes:
                continue
            self._deliver(binding, WatchCommit(first, last, changes, position))
            was_busy = bool(binding.live)
            touched = False
            for change in changes:
                if change.aggregate.startswith("task/"):
                    touched = True
                    role = change.payload.get("role")
                    task_id = int(change.aggregate[5:])
                    if role == "terminal":
                        binding.live.discard(task_id)
                    elif isinstance(role, str):
                        binding.live.add(task_id)
            if touched and was_busy and not binding.live:
                self._deliver(binding, WatchSignal("idle"))

    def _deliver(self, binding: _Binding, event: WatchEvent) -> None:
        if binding.retired:
            return
        if binding.pending >= binding.buffer:
            self._retire(binding)
            self._call(binding, WatchSignal("rebind", "the consumer fell behind"))
            return
        self._call(binding, event)

    def _call(self, binding: _Binding, event: WatchEvent) -> None:
        """Call the listener with one event, in delivery order. A coroutine it returns
        runs after this delivery (a listener cannot await a command inside it: the
        command line is busy publishing); while one runs, later events wait in the
        binding's queue, so an async listener handles whole batches strictly in order."""
        if binding.queue is not None:
            binding.queue.append(event)
            binding.pending += 1
            return
        result = self._invoke(binding, event)
        if result is not None:
            binding.queue = deque()
            binding.pending += 1
            asyncio.ensure_future(self._drain(binding, result)).add_done_callback(_retrieve)

    def _invoke(self, binding: _Binding, event: WatchEvent) -> Awaitable[Any] | None:
        try:
            result = binding.listener(event)
        except Exception as exc:  # a listener never undoes a commit
            if not isinstance(event, WatchSignal):
                self._tell_error(binding, exc)
            return None
        return result if inspect.isawaitable(result) else None

    def _tell_error(self, binding: _Binding, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            told = binding.listener(WatchSignal("handler_error", repr(exc)))
            if inspect.isawaitable(told):  # an async listener: run it too
                asyncio.ensure_future(told).add_done_callback(_retrieve)

    async def _drain(self, binding: _Binding, first: Awaitable[Any]) -> None:
        running: Awaitable[Any] | None = first
        try:
            while running is not None:
                try:
                    await running
                except Exception as exc:
                    self._tell_error(binding, exc)
                binding.pending -= 1
                running = None
                queue = binding.queue
                while queue and running is None:
                    event = queue.popleft()
                    running = self._invoke(binding, event)
                    if running is None:
                        binding.pending -= 1
        finally:
            binding.queue = None

    def fault(self, reason: str) -> None:
        if self._faulted:
            return
        self._faulted = True
        self._saved.clear()
        for binding in list(self.bindings):
            self._deliver(binding, WatchSignal("fault", reason))
            self._retire(binding)

    # ------------------------------------------------------------------ other writers
    def _start_polling(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        """A read-only handle: the owner is another handle or process. One index seek per
        interval; the events after the cursor are read only when there are some. Storage
        that can be told of commits (``wait_commit(after, timeout)``: PostgreSQL's
        LISTEN/NOTIFY) wakes the loop at once; the poll stays as the fallback, so a lost
        notification only delays delivery."""
        storage = self.line.storage
        wait_commit = getattr(storage, "wait_commit", None)
        while self.bindings and not self.line.closed:
            try:
                newest = storage.last_position()
                if newest > self.position:
                    self.durable()
            except Exception as exc:  # the storage went away: tell the watchers
                self.fault(f"watching stopped: {exc}")
                return
            if wait_commit is None or self.position < newest:
                # No wakeups, or stored events the cursor cannot pass yet (a batch whose
                # boundary is not stored): a notification would not change that.
                await asyncio.sleep(self.poll_interval)
            else:
                await wait_commit(after=self.position, timeout=self.poll_interval)
                await asyncio.sleep(0)  # a wakeup that returned at once still yields

    def close(self) -> None:
        """The handle closed: every binding is told (``closed``) and retired."""
        for binding in list(self.bindings):
            self._deliver(binding, WatchSignal("closed", "the handle was closed"))
            self._retire(binding)
        if self._poller is not None:
            self._poller.cancel()


def _as_record(record: AuditRecord) -> _Record:
    return _Record(
        record.position, record.aggregate, record.event, _decoded(record.event, record.payload)
    )


def _decoded(event: str, payload: JsonObject) -> JsonObject:
    """The payload with its JSON-text fields (an entry's content, a task's state, a value)
    as the JSON they hold, as the audit export shows them: one answer, not JSON in JSON."""
    names = JSON_TEXT_FIELDS.get(event)
    if not names:
        return payload
    out = dict(payload)
    for name in names:
        text = out.get(name)
        if isinstance(text, str):
            out[name] = loads(text)
    return out


def _retrieve(f: asyncio.Future[Any]) -> None:
    """A listener's failure to take ``handler_error`` is not reported again."""
    if not f.cancelled():
        f.exception()


def _scope_task(scope: object) -> int | None:
    prefix = working_scope_id("task/")
    if isinstance(scope, str) and scope.startswith(prefix):
        tail = scope[len(prefix) :]
        if tail.isdigit():
            return int(tail)
    return None


class WatchStream:
    """The async-iterator form of a watch: ``async for event in harness.watch(cid)``.
    Events wait in a bounded queue; a consumer more than ``buffer`` events behind gets
    ``WatchSignal("rebind")`` and the stream ends. ``close()`` (or leaving ``async with``)
    retires the binding."""

    def __init__(self) -> None:
        self._queue: deque[WatchEvent] = deque()
        self._ready = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._ended = False
        self.buffer = 0

    def _push(self, event: WatchEvent) -> None:
        if self._ended:
            return
        if len(self._queue) >= self.buffer and not isinstance(event, WatchSignal):
            self._queue.append(WatchSignal("rebind", "the consumer fell behind"))
            self._ended = True
            if self._unsubscribe is not None:
                self._unsubscribe()
        else:
            self._queue.append(event)
            if isinstance(event, WatchSignal) and event.kind in ("fault", "rebind", "closed"):
                self._ended = True
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[WatchEvent]:
        while True:
            while self._queue:
                yield self._queue.popleft()
            if self._ended:
                return
            self._ready.clear()
            await self._ready.wait()

    def close(self) -> None:
        self._ended = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._ready.set()

    async def __aenter__(self) -> WatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
