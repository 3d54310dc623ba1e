"""The owner's live-task mirror (``TaskQueries.own``, issue 18): the line that claimed a
session is the only writer of its tasks, so it keeps the live task rows in memory, loaded
once and then kept by the row ops of each batch it saves. The scheduler's passes and
launches read it instead of the store. It must always equal what the store holds: a save
that fails must not leave it ahead of the store, a read-only handle never mirrors, and an
owner superseded by another handle's claim reads what the other wrote (a cheap change
token: SQLite's ``PRAGMA data_version``). Only on SQLite (storage.py ``own_tasks``): the
memory read model (memory, JSONL) answers the same reads as cheaply itself, and PostgreSQL
has no such token; there every read goes to the store, with the same answers."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import pico
from pico import Command
from pico.application.flows.inputs import queue_address
from pico.domain.errors import PersistenceUncertainError
from pico.domain.json import JsonObject
from pico.domain.state import SESSION_SCOPE, conversation_scope
from pico.infrastructure import storage as storage_module
from pico.infrastructure.storage import EventSourcedStorage
from pico.projections.queries import Queries, StateQueries, TaskQueries
from tests.backends import Backend
from tests.scheddefs import Scripted, settle

LEASE = pico.Lease(ttl=10.0, renew_every=3.0)


async def _open(backend: Backend, **kwargs: Any) -> pico.Harness:
    """A writing handle. PostgreSQL keeps no mirror yet (storage.py ``own_tasks``): there
    the same scenarios must read the store and give the same answers."""
    return await backend.open(**kwargs)


def _mirrors(backend: Backend) -> bool:
    return backend.name == "sqlite"


def _storage(h: pico.Harness) -> EventSourcedStorage:
    storage = h.scheduler.line.storage
    assert isinstance(storage, EventSourcedStorage)
    return storage


async def _sqlite_owner(
    tmp_path: Any,
) -> tuple[pico.Harness, pico.ConversationHandle, EventSourcedStorage, Any]:
    """A SQLite owner with its root conversation, its storage and command line, and its
    mirrors loaded (no live task yet)."""
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'p.db'}", session="s", definitions=[Scripted()]
    )
    c = await h.root()
    storage = _storage(h)
    assert storage.task_queries.live_tasks() == []  # the mirrors load
    return h, c, storage, h.scheduler.line


def _store_live(storage: EventSourcedStorage) -> list[pico.TaskSnapshot]:
    """The live set as the store holds it (a TaskQueries without a mirror)."""
    return TaskQueries(storage._read_store).live_tasks()


def _check_after_every_save(monkeypatch: pytest.MonkeyPatch, checked: list[int]) -> None:
    save = EventSourcedStorage.save

    def checking(self: EventSourcedStorage, *args: Any, **kwargs: Any) -> None:
        save(self, *args, **kwargs)
        if self.task_queries._live is None:
            return
        store = _store_live(self)
        assert self.task_queries.live_tasks() == store
        meta = self.task_queries.live_tasks(state=False)
        assert [t.id for t in meta] == [t.id for t in store]
        for m, s in zip(meta, store, strict=True):
            assert m.state is None and m == s.__class__(**{**s.__dict__, "state": None})
        _check_live_scans(self)
        _check_recent_entries(self)
        _check_tails_and_queues(self)
        ended = list(self.task_queries._ended)  # the tasks it ended last (SQLite's owner)
        assert self.task_queries.get_tasks(ended) == TaskQueries(self._read_store).get_tasks(ended)
        checked.append(len(store))

    monkeypatch.setattr(EventSourcedStorage, "save", checking)


#: Live scans the mirror answers (``TaskQueries.scan_tasks(live=True, ...)``): every
#: filter, both orders, a window and a short page (its cursor).
_LIVE_SCANS: list[dict[str, Any]] = [
    {},
    {"order": "desc"},
    {"limit": 1},
    {"limit": 1, "order": "desc"},
    {"foreground": True},
    {"foreground": False, "order": "desc"},
    {"role": "waiting"},
    {"role": "terminal"},
    {"kind": "work", "abort_requested": False},
    {"abort_requested": True},
    {"conversation_ids": []},
]


def _check_live_scans(storage: EventSourcedStorage) -> None:
    """Every live scan and the session's head, from the mirror, equal the store's (a
    TaskQueries and a StateQueries without the mirror read the store)."""
    mirror, store = storage.task_queries, TaskQueries(storage._read_store)
    live = store.live_tasks()
    ids = [t.id for t in live]
    conversations = sorted({t.conversation_id for t in live})
    scans = [
        *_LIVE_SCANS,
        {"conversation_ids": conversations[:1]},
        {"conversation_ids": [*conversations, 10**6]},
    ]
    if ids:
        scans += [{"after": ids[0]}, {"before": ids[-1], "order": "desc"}]
        scans += [{"after": ids[0] - 1, "before": ids[-1] + 1, "limit": 2}]
    for query in scans:
        assert mirror.scan_tasks(live=True, **query) == store.scan_tasks(live=True, **query), query
    head = storage.queries.meta()
    answers = type(storage.recorder).__name__ == "SqlRecorder"  # SQLite: ``own(scans=True)``
    assert mirror.mirrored_head() == ((head.head if head else 0) if answers else None)
    unmirrored = StateQueries(storage._read_store)
    for scope in [SESSION_SCOPE, *(conversation_scope(c) for c in conversations)]:
        assert storage.state_queries.scan_values(scope).as_of == unmirrored.scan_values(scope).as_of


def _check_recent_entries(storage: EventSourcedStorage) -> None:
    """The entries the owner kept of its saves read as the store's rows do (SQLite's
    owner keeps them: ``Queries.own_entries``)."""
    recent = storage.queries._recent
    if not recent:
        return
    ids = list(recent)
    assert storage.queries.get_entries(ids) == Queries(storage._read_store).get_entries(ids)


@contextlib.contextmanager
def _store_reads(storage: EventSourcedStorage, names: Sequence[str]) -> Iterator[Counter[str]]:
    """How many times each of the read store's methods ``names`` is called in the block."""
    store = storage._read_store
    calls: Counter[str] = Counter()
    originals = {name: getattr(store, name) for name in names}

    def counting(name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return counted

    for name in originals:
        setattr(store, name, counting(name))
    try:
        yield calls
    finally:
        for name, method in originals.items():
            setattr(store, name, method)


def _lost_work(conversation_id: int) -> Any:
    """A command whose batch a test then loses: a waiting task, a context element and a
    queued write (each mirrored by the SQLite owner); returns the element's entry id."""

    def build(tx: Command) -> int:
        tx.create_task(conversation_id, "work", status="waiting")
        entry = tx.append_entry(conversation_id, "user", "lost with its batch")
        tx.append_context(conversation_id, [entry])
        with tx.core():
            tx.set_value(
                queue_address("write", entry), {"mode": "write"}, conversation_id=conversation_id
            )
        return entry

    return build


def _check_tails_and_queues(storage: EventSourcedStorage) -> int:
    """What the owner keeps of its context tails and of its values under a prefix
    (projections/mirrors.py) answers as the store does: every position it answers for
    (each kept tail answers at least for its last), every kept value set. Returns how
    many it checked."""
    checked = 0
    rows, unmirrored = storage._read_store, StateQueries(storage._read_store)
    tails = storage.queries._tails
    if tails is not None and tails.current() is not None:
        for cid, tail in list(tails._tails.items()):
            with rows.read():
                full = rows.context_tail(cid, None)
            assert full is not None and full[0] == tail.revision
            positions = [p for p, _ in full[1]]
            assert tail.last == (positions[-1] if positions else None)
            assert tails.get(cid, tail.last if tail.last is not None else 0) is not None
            for p in [-1, *positions]:
                kept = tails.get(cid, p)
                if kept is not None:
                    with rows.read():
                        assert kept == rows.context_tail(cid, p), (cid, p)
                    checked += 1
    written = storage.state_queries._written
    if written is not None and written.current() is not None:
        for scope, values in list(written._scopes.items()):
            for namespace, key in list(values):
                kept_value = written.get(scope, namespace, key)
                assert kept_value[0], (scope, namespace, key)
                with rows.read():
                    assert kept_value[1] == rows.current_value(scope, namespace, key)
                checked += 1
    prefixed = storage.state_queries._prefixed
    if prefixed is not None and prefixed.current() is not None:
        for scope, prefixes in list(prefixed._scopes.items()):
            for prefix in prefixes:
                kept_rows = prefixed.get(scope, prefix)
                assert kept_rows == unmirrored.values_under(scope, prefix), (scope, prefix)
                checked += 1
    return checked


def _check_head(storage: EventSourcedStorage) -> None:
    """The head the owner's reads page by equals the session row's (from the mirror on
    SQLite, which keeps it; read from the row elsewhere)."""
    meta = storage.queries.meta()
    head = meta.head if meta else 0
    unmirrored = StateQueries(storage._read_store)
    assert storage.state_queries.scan_values(SESSION_SCOPE).as_of == head
    assert unmirrored.scan_values(SESSION_SCOPE).as_of == head
    assert storage.task_queries.scan_tasks(live=True).as_of == head
    if type(storage.recorder).__name__ == "SqlRecorder" and storage.task_queries._token:
        assert storage.task_queries.mirrored_head() == head


async def test_the_mirror_equals_the_store_after_every_commit(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[int] = []
    _check_after_every_save(monkeypatch, checked)
    work = Scripted()

    async def execute(task: pico.TaskSnapshot, ctx: Any) -> None:
        if task.state == {"hold": True}:
            await ctx.command(lambda tx: tx.patch_task(ctx.task_id, status="waiting"))
            return
        await settle(ctx, "done")

    async def recover(task: pico.TaskSnapshot, ctx: Any) -> None:
        return None  # a waiting task's phase is armed once: it stays waiting

    work.on_execute = execute
    work.on_recover = recover
    h = await _open(backend, definitions=[work])
    c = await h.root()
    assert await c.drive() == "idle"  # loads the mirror (nothing live yet)

    def graph(tx: Command) -> tuple[int, int, int]:
        held = tx.create_task(c.id, "work", state={"hold": True})
        first = tx.create_task(c.id, "work", foreground=True)
        then = tx.create_task(c.id, "work", after=[first], foreground=True, state={"n": 1})
        tx.create_task(c.id, "work", status="done")  # created terminal: never mirrored
        return held, first, then

    held, first, then = await h.command(graph)

    def notes(tx: Command) -> None:  # entries the owner keeps (SQLite) beside the store's
        tx.append_entry(c.id, "user", {"text": "a note"}, metadata={"via": "test"}, key="k1")
        tx.append_entry(c.id, "assistant", "plain text", by_task_id=held)

    await h.command(notes)
    assert await c.drive() == "idle"
    assert (await h.task(held)).status == "waiting"  # type: ignore[union-attr]
    for done in (first, then):
        assert (await h.task(done)).status == "done"  # type: ignore[union-attr]

    def own_and_mark(tx: Command) -> int:
        child = tx.create_owned_conversation(held)
        assert tx.request_abort(held)
        return child

    child = await h.command(own_and_mark)
    mirrored = {t.id: t for t in h.scheduler.live_tasks(None)}
    assert mirrored[held].abort_requested and mirrored[held].owned_conversation_id == child
    assert await h.drive() == "idle"  # the marked task is aborted
    assert h.scheduler.live_tasks(None) == [] == _store_live(_storage(h))
    await h.close()
    # Checked after the graph, the waiting patch, the link and mark, and each settlement.
    if _mirrors(backend):
        assert len(checked) >= 6 and max(checked) == 3
    else:
        assert checked == []  # no mirror was ever loaded: every read went to the store


async def test_a_pass_reads_no_task_rows_once_the_mirror_is_loaded(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = Scripted()
    h = await _open(backend, definitions=[work])
    c = await h.root()
    await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting", foreground=False))
    store = _storage(h)._read_store
    reads: list[str] = []
    for name in ("scan_task_rows", "task_rows"):
        method = getattr(store, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            reads.append(_name)
            return _method(*args, **kw)

        monkeypatch.setattr(store, name, counted)
    _storage(h).task_queries.forget()
    assert await c.drive() == "idle"
    if _mirrors(backend):
        assert reads == ["scan_task_rows"]  # the mirror loaded: one scan of the live set
    else:
        assert reads[0] == "scan_task_rows"  # the pass scans the store's live set
    reads.clear()
    for _ in range(3):
        assert await c.drive() == "idle"
    tid = await h.command(lambda tx: tx.create_task(c.id, "work", foreground=True))
    assert await c.drive() == "idle"  # launched and settled from the mirror's record
    assert work.calls[-1] == ("execute", tid)
    if _mirrors(backend):
        assert reads == []
    else:  # no mirror: each of the four passes scans the live set, each launch reads its row
        assert reads.count("scan_task_rows") >= 4 and "task_rows" in reads
    await h.close()


async def test_a_failed_save_drops_the_mirror_and_the_store_decides(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = Scripted()
    h = await _open(backend, definitions=[work])
    c = await h.root()
    kept = await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    storage = _storage(h)
    assert [t.id for t in storage.task_queries.live_tasks()] == [kept]  # loaded

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(storage.recorder, "insert_events", refuse)
    with pytest.raises(PersistenceUncertainError):
        await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    assert storage.task_queries._live is None  # forgotten: nothing unsaved is served
    monkeypatch.undo()
    assert [t.id for t in storage.task_queries.live_tasks()] == [kept]
    await h.close()


async def test_a_rolled_back_deferred_batch_leaves_no_task_in_the_mirror(
    sql_backend: Backend,
) -> None:
    """A deferred (group-committed) command is applied to the mirror when saved; when its
    batch then fails to commit, the mirror is dropped with it."""
    work = Scripted()
    h = await _open(sql_backend, definitions=[work])
    c = await h.root()
    line = h.scheduler.line
    storage = _storage(h)
    assert storage.task_queries.live_tasks() == []  # loaded

    scope = conversation_scope(c.id)
    before = storage.queries.context_tail(c.id, None)  # the owner's tail and queue: kept
    assert before == (0, []) and storage.state_queries.values_under(scope, "pico.queue.") == []

    entry = await line.run(_lost_work(c.id), defer=True)
    assert len(storage.task_queries.live_tasks()) == 1  # the owner sees its deferred batch
    assert storage.queries.context_tail(c.id, 0) is not None
    assert storage.queries.context_tail(c.id, None) == (0, [(0, entry)])  # its own, kept
    assert len(storage.state_queries.values_under(scope, "pico.queue.")) == 1
    assert list(await h.get_entries([entry])) == [entry]  # the deferred batch: kept
    flush = storage.recorder.flush  # type: ignore[attr-defined]

    def failing() -> None:
        storage.recorder.abandon("test: the commit failed")  # type: ignore[attr-defined]
        raise OSError("commit failed")

    storage.recorder.flush = failing  # type: ignore[attr-defined]
    with pytest.raises(PersistenceUncertainError):
        line.flush()
    storage.recorder.flush = flush  # type: ignore[attr-defined]
    assert storage.task_queries._live is None
    assert storage.task_queries.live_tasks() == [] == _store_live(storage)
    _check_head(storage)  # not the rolled-back command's
    assert storage.queries.context_tail(c.id, None) == (0, [])  # nor its context or queue
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    assert storage.queries.get_entries([entry]) == {}  # the handle faulted: its queries
    assert Queries(storage._read_store).get_entries([entry]) == {}
    await h.close()


async def test_only_a_writing_sqlite_handle_mirrors(backend: Backend) -> None:
    work = Scripted()
    lease: dict[str, Any] = {"lease": LEASE} if backend.name == "postgresql" else {}
    h = await backend.open(definitions=[work], **lease)
    c = await h.root()
    await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    assert h.scheduler.live_tasks(None)
    # PostgreSQL, even under a lease, reads every live set from the store; the memory read
    # model (memory, JSONL) answers them itself.
    assert (_storage(h).task_queries._token is None) == (backend.name != "sqlite")
    if backend.name != "memory":  # a memory session has no second, read-only handle
        await h.close()
        reader = await backend.open(read_only=True, definitions=[work])
        assert [t.status for t in reader.scheduler.live_tasks(None)] == ["waiting"]
        assert _storage(reader).task_queries._token is None  # never claimed: reads the store
        await reader.close()
    else:
        await h.close()


async def test_an_owner_superseded_by_another_claim_reads_what_the_other_wrote(
    backend: Backend,
) -> None:
    work = Scripted()
    first = await backend.open(definitions=[work])
    c = await first.root()
    tid = await first.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    assert [t.id for t in first.scheduler.live_tasks(None)] == [tid]  # mirror loaded
    if backend.exclusive_writer:  # JSONL: the lock refuses the second writer instead
        with pytest.raises(pico.SessionLockedError):
            await backend.open(definitions=[work])
        assert first.scheduler.live_tasks(None) == _store_live(_storage(first))
        await first.close()
        return
    storage = _storage(first)
    scope = conversation_scope(c.id)

    def own(tx: Command) -> None:
        tx.append_context(c.id, [tx.append_entry(c.id, "user", "the first's")])

    await first.command(own)
    before = storage.queries.context_tail(c.id, None)  # the owner's tail and queue: kept
    assert before is not None and [p for p, _ in before[1]] == [0]
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    second = await backend.open(definitions=[work])
    queued = queue_address("follow_up", 7)

    def other(tx: Command) -> int:
        tx.patch_task(tid, status="done")
        entry = tx.append_entry(c.id, "user", "the other's")
        tx.append_context(c.id, [entry])
        with tx.core():
            tx.set_value(queued, {"mode": "follow_up"}, conversation_id=c.id)
        return entry

    entry = await second.command(other)
    # The first handle has not saved since: its mirrors must not serve the old rows.
    assert first.faulted is None
    assert storage.queries.context_tail(c.id, 0) == (0, [(1, entry)])
    assert [k for _, k, _, _ in storage.state_queries.values_under(scope, "pico.queue.")] == [
        queued.storage_key
    ]
    assert first.scheduler.live_tasks(None) == [] == _store_live(_storage(first))
    _check_head(_storage(first))  # the head the other's commit moved, not the old one
    assert (await first.task(tid)).status == "done"  # type: ignore[union-attr]
    assert await first.scheduler.drive(c.id) == "idle"
    assert work.calls == []  # nothing was recovered for the task the other settled
    await second.close()
    await first.close()


async def test_a_lost_deferred_batch_is_read_again_from_the_store(
    sql_backend: Backend,
) -> None:
    """A deferred batch the store lost below the storage (a read failing inside it on
    PostgreSQL, ``RawWriter.batch_aborted``) moves the change token: the mirror reloads."""
    work = Scripted()
    h = await _open(sql_backend, definitions=[work])
    c = await h.root()
    storage = _storage(h)
    line = h.scheduler.line
    assert storage.task_queries.live_tasks() == []  # loaded
    scope = conversation_scope(c.id)

    def note(tx: Command) -> int:
        entry = tx.append_entry(c.id, "user", "a note")
        tx.append_context(c.id, [entry])
        return entry

    kept = await h.command(note)  # durable
    assert storage.queries.context_tail(c.id, None) == (0, [(0, kept)])  # then kept
    assert storage.state_queries.values_under(scope, "pico.queue.") == []

    lost = await line.run(_lost_work(c.id), defer=True)
    assert len(storage.task_queries.live_tasks()) == 1
    assert storage.queries.context_tail(c.id, 0) == (0, [(1, lost)])
    assert len(storage.state_queries.values_under(scope, "pico.queue.")) == 1
    storage.recorder.writer.batch_aborted(RuntimeError("test: the batch is gone"))  # type: ignore[attr-defined]
    assert storage.task_queries.live_tasks() == [] == _store_live(storage)
    _check_head(storage)
    # Nor the lost batch's context element and queue value (the mirrors are read again).
    assert storage.queries.context_tail(c.id, 0) == (0, [])
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    h.scheduler.line.fault("test: done")
    await h.close()


async def test_a_sqlite_snapshot_ends_only_the_read_transaction_it_began(
    tmp_path: Any,
) -> None:
    """A read snapshot begins its transaction at its first query; one that has read nothing
    when a deferred save opens the writer's transaction on the same connection leaves that
    transaction to the writer (a ROLLBACK would drop the batch)."""
    work = Scripted()
    h = await pico.Harness.open(f"sqlite:///{tmp_path / 'p.db'}", session="s", definitions=[work])
    c = await h.root()
    line = h.scheduler.line
    storage = _storage(h)
    with storage.snapshot():  # on the writer's idle connection, nothing read yet
        tid = await line.run(lambda tx: tx.create_task(c.id, "work", status="waiting"), defer=True)
    assert storage.recorder.writer.pending  # type: ignore[attr-defined]
    line.flush()
    assert (await h.task(tid)).status == "waiting"  # type: ignore[union-attr]
    await h.close()
    again = await pico.Harness.open(f"sqlite:///{tmp_path / 'p.db'}", session="s", read_only=True)
    assert (await again.task(tid)).status == "waiting"  # type: ignore[union-attr]
    report = await pico.check(f"sqlite:///{tmp_path / 'p.db'}", session="s")
    assert report.ok, report
    await again.close()


async def test_an_owners_prompt_reads_no_session_row_and_no_live_task_rows(
    backend: Backend,
) -> None:
    """On SQLite the busy check of an accepted prompt (its conversation's live foreground
    tasks) and the queue scan's page head come from the owner's mirror, and the entries the
    model's context adds from those it saved: a turn reads neither the session row nor
    task or entry rows, each a statement. The memory read
    model (memory, JSONL) answers those scans as cheaply itself; PostgreSQL keeps no
    mirror: it reads both."""
    h = await _open(backend, provider=pico.FauxProvider(["one", "two"]))
    c = await h.root()
    await c.prompt("first")  # the mirror loads
    names = (
        "meta",
        "scan_task_rows",
        "task_rows",
        "entry_rows",
        "context_tail",
        "scan_values",
        "address_policy",
        "current_value",
    )
    with _store_reads(_storage(h), names) as calls:
        _, result = await c.prompt("second")
    assert result is not None and result.status == "done"
    if backend.name == "sqlite":
        # The context projection's new entries: the owner's own, kept. The input's result:
        # a new key (no policy to read), then read back from what the owner wrote.
        assert calls == {}
    elif backend.name != "postgresql":  # memory, JSONL: the read model answers itself
        assert calls.get("entry_rows", 0) >= 1
    else:
        assert calls.get("meta", 0) >= 1 and calls.get("scan_task_rows", 0) >= 1
        assert calls.get("current_value", 0) >= 1  # the result, read from the store
    await h.close()


async def test_a_working_scope_command_moves_the_mirrored_head(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A working-scope command commits a boundary too (not a main one): it moves the
    session's head, in the row and in the owner's mirror alike."""
    checked: list[int] = []
    _check_after_every_save(monkeypatch, checked)
    h = await _open(backend, definitions=[Scripted()])
    c = await h.root()
    storage = _storage(h)
    await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    storage.task_queries.live_tasks()  # the mirror is loaded
    before = storage.queries.meta()
    frames = pico.working_list("test.frames", str, scope=pico.working_scope("task-7"))
    await h.command(pico.working_scope("task-7"), lambda tx: tx.append_list(frames, "f"))
    after = storage.queries.meta()
    assert before is not None and after is not None
    assert after.head > before.head and after.main_head == before.main_head
    _check_head(storage)
    if _mirrors(backend):
        assert checked  # the every-save check ran with the mirror loaded
    await h.close()


async def test_the_context_tails_and_queues_equal_the_store_after_every_commit(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's context tails and input queues (projections/mirrors.py) through every
    change a context and a queue take: appends, a prefix replacement, a reset, a queued
    input and its removal, a fork with a sticky copy of it, a deletion. After every save
    what the owner keeps answers as the store does, and at the end it keeps both."""
    checked: list[int] = []
    _check_after_every_save(monkeypatch, checked)
    queued = queue_address("follow_up", 42)
    h = await _open(backend, provider=pico.FauxProvider(["one", "two"]))
    c = await h.root()
    await c.prompt("first")  # the task mirror loads
    storage = _storage(h)
    scope = conversation_scope(c.id)

    def note(text: str) -> Any:
        def build(tx: Command) -> int:
            entry = tx.append_entry(c.id, "user", {"text": text})
            tx.append_context(c.id, [entry])
            return entry

        return build

    start = storage.queries.context_tail(c.id, None)  # read once, then kept
    assert start is not None
    first = await h.command(note("a"))
    middle = await h.command(note("b"))
    last = await h.command(note("c"))
    after = start[1][-1][0]
    tail = storage.queries.context_tail(c.id, after)  # the three appends, from the tail
    assert tail is not None and [e for _, e in tail[1]] == [first, middle, last]
    assert [p for p, _ in tail[1]] == [after + 1, after + 2, after + 3]

    def compact(tx: Command) -> None:
        summary = tx.append_entry(c.id, "user", {"text": "summary of a"})
        tx.replace_context_prefix(c.id, first, [summary])

    await h.command(compact)
    replaced = storage.queries.context_tail(c.id, None)
    assert replaced is not None and replaced[0] == start[0] + 1
    await h.command(note("d"))
    await h.command(lambda tx: tx.reset_context(c.id, [first]))
    await h.command(note("e"))
    assert storage.state_queries.values_under(scope, "pico.queue.") == []  # read, kept

    def enqueue(tx: Command) -> None:
        with tx.core():
            tx.set_value(queued, {"mode": "follow_up"}, conversation_id=c.id)

    await h.command(enqueue)
    key = queued.storage_key
    found = storage.state_queries.values_under(scope, "pico.queue.")
    assert [(ns, k) for ns, k, _, _ in found] == [("pico.queue.follow_up", key)]
    head = storage.queries.main_head()

    def fork_with_queue(tx: Command) -> int:
        with tx.core():  # a copy into pico's own namespace: the core's to write
            return tx.fork(c.id, as_of=head, sticky=[queued])

    fork = await h.command(fork_with_queue)
    in_fork = storage.state_queries.values_under(conversation_scope(fork), "pico.queue.")
    assert [k for _, k, _, _ in in_fork] == [key]

    def dequeue(tx: Command) -> None:
        with tx.core():
            tx.delete_value(queued, conversation_id=c.id)

    await h.command(dequeue)
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    await h.command(lambda tx: tx.delete_conversation(fork))
    _, result = await c.prompt("second")  # a turn over the reset context
    assert result is not None and result.status == "done"
    kept = _check_tails_and_queues(storage)
    await h.close()
    if backend.name == "sqlite":
        assert kept >= 3 and len(checked) >= 10  # both mirrors kept, checked at each save
    else:  # the memory read model answers as cheaply; PostgreSQL keeps no mirror
        assert kept == 0 and checked == []  # no mirror loaded: nothing to check it against


async def test_an_owners_tool_turn_reads_no_task_context_or_queue_rows(tmp_path: Any) -> None:
    """SQLite: a turn with two tool calls reads back the tool tasks its saves ended (the
    join), the context elements it appended and its queues, from what the owner kept
    (``TaskQueries._ended``, projections/mirrors.py): none of them is a statement."""
    schema: JsonObject = {"type": "object", "properties": {"path": {"type": "string"}}}

    async def read(args: Any, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    script: list[Any] = []
    for i in range(2):
        calls: list[tuple[str, JsonObject]] = [
            ("read", {"path": f"a{i}"}),
            ("read", {"path": f"b{i}"}),
        ]
        script += [pico.FauxResponse(text="looking", tool_calls=calls), f"answer {i}"]
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'p.db'}",
        session="s",
        provider=pico.FauxProvider(script),
        tools=[pico.Tool("read", "Read", schema, read)],
    )
    c = await h.root()
    _, first = await c.prompt("first")  # the mirrors load
    assert first is not None and first.status == "done"
    names = ("task_rows", "scan_task_rows", "context_tail", "scan_values", "entry_rows")
    with _store_reads(_storage(h), names) as reads:
        _, second = await c.prompt("second")
    assert second is not None and second.status == "done"
    assert reads == {}
    ended = _storage(h).task_queries._ended
    assert len([t for t in ended.values() if t.kind == "tool"]) == 4  # both turns' tools
    await h.close()


async def test_an_owners_snapshot_leaves_its_mirrors_and_page_cache_alone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: the owner writes its aggregates' snapshots on its own writer's connection
    (container.py), so a snapshot is not another connection's commit: the change token
    stays, the mirrors keep answering (no reload of the live tasks, the tails and the
    values it wrote) and the connection's page cache stays warm."""
    monkeypatch.setattr(storage_module, "SNAPSHOT_INTERVAL", 10)  # one every few turns
    path = tmp_path / "p.db"
    h = await pico.Harness.open(
        f"sqlite:///{path}", session="s", provider=pico.FauxProvider(["ok"] * 40)
    )
    c = await h.root()
    storage = _storage(h)
    await c.prompt("first")  # the mirrors load

    def snapshots() -> int:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT count(*) FROM pico_snapshots").fetchone()[0])

    token, generation, before = storage.recorder.writer.change_token(), None, snapshots()  # type: ignore[attr-defined]
    for i in range(30):
        generation = storage.task_queries.generation
        _, result = await c.prompt(f"turn {i}")
        assert result is not None and result.status == "done"
        if snapshots() > before:
            break
    assert snapshots() > before, "no snapshot in 30 turns: the interval moved?"
    assert storage.recorder.writer.change_token()[1:] == token[1:]  # type: ignore[attr-defined]
    assert storage.task_queries.generation == generation  # the turn with the snapshot
    names = ("meta", "scan_task_rows", "task_rows", "context_tail", "scan_values", "current_value")
    with _store_reads(storage, names) as calls:
        _, result = await c.prompt("after the snapshot")
    assert result is not None and calls == {}
    await h.close()


async def test_a_batch_sqlite_rolled_back_by_itself_is_not_served_by_the_mirrors(
    tmp_path: Any,
) -> None:
    """SQLite rolls an open transaction back by itself after an I/O or out-of-memory error
    inside it (here: a ROLLBACK on the writer's connection stands in for one). The deferred
    batch is gone while the writer still holds it pending: the change token moves, so the
    owner's mirrors (live tasks, context tail, queue) read the store again instead of
    serving the lost rows."""
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'p.db'}", session="s", definitions=[Scripted()]
    )
    c = await h.root()
    storage = _storage(h)
    line = h.scheduler.line
    scope = conversation_scope(c.id)
    assert storage.task_queries.live_tasks() == []  # the mirrors load
    assert storage.queries.context_tail(c.id, None) == (0, [])
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    written = storage.state_queries._written
    assert written is not None and written.current() is not None  # keeps what it writes

    entry = await line.run(_lost_work(c.id), defer=True)
    queued = queue_address("write", entry)
    value = (scope, queued.namespace, queued.storage_key)
    assert len(storage.task_queries.live_tasks()) == 1  # the owner's own deferred batch
    assert storage.queries.context_tail(c.id, None) == (0, [(0, entry)])
    assert len(storage.state_queries.values_under(scope, "pico.queue.")) == 1
    assert written.get(*value)[0]  # kept: what it wrote
    assert storage.state_queries.get_value(*value, rewind=False) is not None
    assert storage.queries._recent is not None and entry in storage.queries._recent
    assert list(storage.queries.get_entries([entry])) == [entry]  # its recent entries
    storage.recorder.writer.connection().execute("ROLLBACK")  # type: ignore[attr-defined]
    assert storage.task_queries.live_tasks() == [] == _store_live(storage)
    assert storage.queries.context_tail(c.id, 0) == (0, [])
    assert storage.state_queries.values_under(scope, "pico.queue.") == []
    assert storage.state_queries.get_value(*value, rewind=False) is None
    assert storage.queries.get_entries([entry]) == {}  # nor the entry it saved last
    assert await h.entry(entry) is None
    line.fault("test: done")
    await h.close()


async def test_another_thread_reads_only_what_is_committed_not_the_owners_mirrors(
    tmp_path: Any,
) -> None:
    """The owner's mirrors hold what its saves wrote, an open deferred batch included; a
    read on another thread is answered by the store's reader connections, which see only
    committed rows, and never by the mirrors: no task, entry or head of the open batch,
    and no page that mixes the two."""
    h, c, storage, line = await _sqlite_owner(tmp_path)
    head = storage.queries.meta()
    assert head is not None

    def build(tx: Command) -> tuple[int, int]:
        task = tx.create_task(c.id, "work", status="waiting")
        return task, tx.append_entry(c.id, "user", "deferred")

    task, entry = await line.run(build, defer=True)
    assert line.pending  # the batch is open on the writer's connection
    # On the writer's thread the owner sees its own batch (the mirrors answer).
    assert list(storage.tasks.get_tasks([task])) == [task]
    assert list(storage.queries.get_entries([entry])) == [entry]
    seen: dict[str, Any] = {}

    def elsewhere() -> None:
        seen["tasks"] = storage.tasks.get_tasks([task])
        seen["live"] = storage.task_queries.live_tasks()
        seen["entries"] = storage.queries.get_entries([entry])
        seen["as_of"] = storage.state_queries.scan_values(SESSION_SCOPE).as_of

    def on_another_thread() -> None:
        # Joined with the event loop held: the flush window's timer cannot commit the
        # batch while the other thread reads.
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()

    on_another_thread()
    assert seen["tasks"] == {} and seen["live"] == [] and seen["entries"] == {}
    assert seen["as_of"] == head.head  # the committed head, not the batch's
    assert line.pending  # still open: what the thread read was the committed state
    line.flush()
    on_another_thread()  # committed now: every thread sees it
    assert list(seen["tasks"]) == [task] and list(seen["entries"]) == [entry]
    assert seen["as_of"] > head.head
    await h.close()


async def test_a_driver_error_checking_for_other_writers_is_a_storage_error(
    tmp_path: Any,
) -> None:
    """The mirrors ask the writer's connection whether anyone else committed (``PRAGMA
    data_version``) before they answer: a driver error there is reported as a store read's
    is (``StorageUnavailableError``), never as the driver's own exception, and the handle
    answers again once the connection does."""
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'p.db'}", session="s", definitions=[Scripted()]
    )
    c = await h.root()
    task = await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    storage = _storage(h)
    assert [t.id for t in storage.task_queries.live_tasks()] == [task]  # the mirror loads
    conn = storage.recorder.writer.connection()  # type: ignore[attr-defined]
    conn.set_progress_handler(lambda: 1, 1)  # every statement on it is interrupted
    try:
        with pytest.raises(pico.StorageUnavailableError, match="other writers' commits"):
            await h.task(task)
        with pytest.raises(pico.StorageUnavailableError, match="other writers' commits"):
            await h.tasks(live=True)
    finally:
        conn.set_progress_handler(None, 1)
    found = await h.task(task)
    assert found is not None and found.id == task
    await h.close()


async def test_a_batch_sqlite_rolled_back_by_itself_stays_lost_inside_a_later_read_snapshot(
    tmp_path: Any,
) -> None:
    """The same loss, then a read snapshot on the writer's connection opens a transaction
    of its own before anything checks the mirrors: the connection is in a transaction
    again, but not the batch's, and the mirrors still read the store."""
    h, c, storage, line = await _sqlite_owner(tmp_path)
    await line.run(_lost_work(c.id), defer=True)
    assert len(storage.task_queries.live_tasks()) == 1  # the owner's own deferred batch
    writer = storage.recorder.writer  # type: ignore[attr-defined]
    writer.connection().execute("ROLLBACK")
    with storage.snapshot():
        assert storage.reads.get_conversations([c.id])  # the snapshot's BEGIN on the writer
        assert writer.connection().in_transaction
        assert storage.task_queries.live_tasks() == [] == _store_live(storage)
    line.fault("test: done")
    await h.close()
