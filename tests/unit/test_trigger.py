"""pico's ``trigger_event`` (domain/trigger.py) builds exactly the event the library's does:
the same session, run once with each, stores the same events byte for byte (every type
the flows below trigger: commits, claims, task patches, marks and links, entries,
contexts, prefix replacement, reset, deletion, every kind of scoped-state write, working
scopes), and the aggregates end in the same state."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from eventsourcing.domain import Aggregate

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain import conversation as conversation_module
from pico.domain.conversation import Conversation
from pico.domain.session import Session
from pico.domain.task import Task
from pico.domain.trigger import command_stamp, trigger_event
from pico.infrastructure.memory import named_database

PLAN = pico.conversation_value("t.plan", int)
NOTES = pico.conversation_list("t.notes", str)
STICKY = pico.conversation_value("t.sticky", str, rewind=False)
GLOBAL: pico.SessionValue[Any] = pico.SessionValue(namespace="t.global", key="k")


async def _session(url: str) -> None:
    async def read(args: Any, ctx: ToolContext) -> str:
        return f"read {args['path']}"

    script: list[Any] = [
        FauxResponse(text="looking", tool_calls=[("read", {"path": "a"}), ("read", {"path": "b"})]),
        "both read",
        "a summary of it all",
    ]
    tools = [pico.Tool("read", "Read", {"type": "object"}, read)]
    h = await pico.Harness.open(url, session="s", provider=FauxProvider(script), tools=tools)
    c = await h.root()
    _, result = await c.prompt("question")
    assert result is not None and result.status == "done"
    await c.set_value(PLAN, 1)
    await c.append_list(NOTES, "n1")
    await c.set_value(STICKY, "s")
    await h.command(lambda tx: tx.set_value(GLOBAL, {"x": 1}))
    await h.command(lambda tx: tx.delete_value(GLOBAL))
    await c.clear_list(NOTES)
    await c.delete_value(STICKY)
    marker = await c.append("user", "a marker")
    fork = await c.fork(at_entry=marker)
    await fork.append("user", "in the fork")

    other = await h.command(lambda tx: tx.create_conversation())
    await h.command(lambda tx: tx.reset_context(other))
    await h.command(lambda tx: tx.delete_conversation(other))
    await c.collapse()
    assert await c.drive() == "idle"
    await h.close()


def _stored(name: str) -> list[tuple[Any, ...]]:
    db = named_database(name)
    return [(e.originator_id, e.originator_version, e.topic, e.state) for e in db.session_log("s")]


def _fixed_clock(monkeypatch: pytest.MonkeyPatch, *, command_stamps: bool = False) -> None:
    """Every clock reading from a fresh counter, and the claim's owner name from another,
    so two runs stamp alike. pico reads the clock once a command (``stamp_command``);
    ``command_stamps`` gives the library's ``trigger_event``, which reads it for every
    event, the command's reading while one is stamped, as pico's events carry it."""
    start = datetime(2026, 12, 2, tzinfo=UTC)
    ticks = itertools.count()
    owners = itertools.count()

    def clock(cls: Any) -> datetime:
        stamp = command_stamp() if command_stamps else None
        if stamp is not None:
            return stamp
        return start + timedelta(microseconds=next(ticks))

    monkeypatch.setattr(Aggregate.Event, "create_timestamp", classmethod(clock))
    # The claim names its owner with uuid.uuid4() (application/line.py).
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(owners)))


def test_the_fast_trigger_stores_what_the_library_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fixed_clock(monkeypatch)
    asyncio.run(_session("memory://trigger-fast"))
    fast = _stored("trigger-fast")
    for cls in (Task, Conversation, Session):
        assert cls.trigger_event is trigger_event
        monkeypatch.setattr(cls, "trigger_event", Aggregate.trigger_event)
    monkeypatch.setattr(Task, "start", classmethod(_library_start))
    monkeypatch.setattr(conversation_module, "create_aggregate", _library_create)
    _fixed_clock(monkeypatch, command_stamps=True)
    asyncio.run(_session("memory://trigger-library"))
    library = _stored("trigger-library")
    topics = {topic.rsplit(".", 1)[-1] for _, _, topic, _ in library}
    # The run covers the event types the aggregates trigger on the hot paths.
    for name in ("Committed", "Claimed", "Patched", "EntryAppended", "ContextAppended"):
        assert name in topics, name
    for name in ("ValueSet", "ValueDeleted", "ListAppended", "ListCleared", "ContextReset"):
        assert name in topics, name
    assert "Deleted" in topics and "ContextPrefixReplaced" in topics
    assert len(fast) == len(library)
    for a, b in zip(fast, library, strict=True):
        assert a == b


def _library_start(cls: type[Task], /, **kwargs: Any) -> Task:
    return cls._create(cls.Created, **kwargs)


def _library_create(aggregate_class: Any, event_class: Any, /, **kwargs: Any) -> Any:
    return aggregate_class._create(event_class, **kwargs)


_TASK: dict[str, Any] = {
    "session_id": "s",
    "task_id": 7,
    "conversation_id": 1,
    "kind": "tool",
    "status": "pending",
    "role": "ready",
    "state": '{"a":1}',
    "after": [3],
    "foreground": True,
    "spawned_by": None,
    "not_before": None,
    "required_permit": None,
}


def test_a_task_is_created_as_the_library_creates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _fixed_clock(monkeypatch)
    fast = Task.start(**_TASK)
    _fixed_clock(monkeypatch)
    library = _library_start(Task, **_TASK)
    assert type(fast) is Task
    assert vars(fast).keys() == vars(library).keys()
    for name, value in vars(library).items():
        if name != "_pending_events":
            assert vars(fast)[name] == value, name
    (a,), (b,) = fast.pending_events, library.pending_events
    assert type(a) is type(b) is Task.Created
    assert list(vars(a).items()) == list(vars(b).items())
    # A created task takes its next event as a library-created one does.
    fast.patch(
        seq=9,
        status="done",
        role="terminal",
        state=None,
        after=[],
        not_before=None,
        required_permit=None,
    )
    assert fast.version == 2 and fast.terminal


def test_a_task_with_a_missing_or_unknown_field_is_refused() -> None:
    missing = {k: v for k, v in _TASK.items() if k != "kind"}
    with pytest.raises(TypeError, match="missing field 'kind'"):
        Task.start(**missing)
    with pytest.raises(TypeError, match="unexpected fields \\['colour'\\]"):
        Task.start(**_TASK, colour="red")


def test_missing_and_unknown_fields_are_refused_like_the_library() -> None:
    session = Session(session_id="s")
    with pytest.raises(TypeError, match="missing field 'last'"):
        session.trigger_event(Session.Committed, first=1, scope="main", link="", task=None)
    with pytest.raises(TypeError, match="unexpected fields \\['colour'\\]"):
        session.trigger_event(
            Session.Committed, first=1, last=1, scope="main", link="", task=None, colour=1
        )
    assert session.version == 1 and len(session.pending_events) == 1  # only its creation


def test_an_event_given_its_fields_in_any_order_stores_them_in_the_field_order() -> None:
    # Fields given in their declared order are copied at once; any other order (or a
    # default left out) is laid out field by field: the body is the same either way.
    in_order = Session(session_id="s")
    in_order.trigger_event(Session.Committed, first=1, last=2, scope="main", link="", task=3)
    reversed_ = Session(session_id="s")
    reversed_.trigger_event(Session.Committed, task=3, link="", scope="main", last=2, first=1)
    expected = ["originator_id", "originator_version", "timestamp"]
    expected += ["first", "last", "scope", "link", "task"]
    for session in (in_order, reversed_):
        event = session.pending_events[-1]
        assert isinstance(event, Session.Committed)
        assert list(vars(event)) == expected
        assert (event.first, event.last, event.scope, event.task) == (1, 2, "main", 3)


def test_the_aggregate_ends_as_the_library_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _fixed_clock(monkeypatch)
    fast = Session(session_id="s")
    fast.commit(first=1, last=1)
    fast.set_value(seq=2, namespace="n", key="k", value="1")
    _fixed_clock(monkeypatch)
    monkeypatch.setattr(Session, "trigger_event", Aggregate.trigger_event)
    library = Session(session_id="s")
    library.commit(first=1, last=1)
    library.set_value(seq=2, namespace="n", key="k", value="1")

    def state(a: Session) -> dict[str, Any]:
        return {k: v for k, v in vars(a).items() if k != "_pending_events"}

    assert state(fast) == state(library)
    assert fast.version == 3 and fast.modified_on == library.modified_on
    pairs = zip(fast.pending_events, library.pending_events, strict=True)
    assert all(list(vars(a).items()) == list(vars(b).items()) for a, b in pairs)


def _stamps(name: str) -> list[list[str]]:
    """Each command's event timestamps, in storage order (an opening's claim batch, not a
    command, is left out)."""
    batches: list[list[str]] = [[]]
    for e in named_database(name).session_log("s"):
        batches[-1].append(json.loads(e.state)["timestamp"]["_data_"])
        if e.topic.endswith("Session.Claimed"):
            batches[-1] = []
        elif e.topic.endswith("Session.Committed"):
            batches.append([])
    return [b for b in batches if b]


def test_a_commands_events_carry_one_timestamp_and_commands_move_it_on() -> None:
    asyncio.run(_session("memory://trigger-stamps"))
    batches = _stamps("trigger-stamps")
    assert len(batches) > 20 and max(len(b) for b in batches) >= 5
    for batch in batches:
        assert len(set(batch)) == 1, batch  # every event of a batch: one reading
    firsts = [datetime.fromisoformat(b[0]) for b in batches]
    assert firsts == sorted(firsts) and len(set(firsts)) > 1
    assert command_stamp() is None  # no command's stamp outlives it


def test_a_failed_command_leaves_no_stamp_behind() -> None:
    async def go() -> None:
        h = await pico.Harness.open("memory://trigger-failed", session="s")

        def fail(tx: Any) -> None:
            assert command_stamp() is not None  # the command's own, while it builds
            raise RuntimeError("refused")

        with pytest.raises(RuntimeError):
            await h.command(fail)
        assert command_stamp() is None
        await h.close()

    asyncio.run(go())


def test_interleaved_commands_each_stamp_their_own_events() -> None:
    """Two sessions' commands interleave on one loop (each in its own asyncio task), in
    both orders of ending: every event of each carries its own command's reading, taken
    before its builder ran, and no stamp is left behind."""

    async def go(first_ends: str) -> None:
        a = await pico.Harness.open(f"memory://trigger-a-{first_ends}", session="s")
        b = await pico.Harness.open(f"memory://trigger-b-{first_ends}", session="s")
        started = {"a": asyncio.Event(), "b": asyncio.Event()}
        release = {"a": asyncio.Event(), "b": asyncio.Event()}
        seen: dict[str, list[datetime | None]] = {"a": [], "b": []}
        built: dict[str, datetime] = {}

        def build(name: str) -> Any:
            async def run(tx: Any) -> None:
                built[name] = datetime.now(UTC)
                seen[name].append(command_stamp())
                tx.set_value(GLOBAL, f"{name} before")
                started[name].set()
                await release[name].wait()
                seen[name].append(command_stamp())
                tx.set_value(GLOBAL, f"{name} after")

            return run

        ta = asyncio.ensure_future(a.command(build("a")))
        await started["a"].wait()
        tb = asyncio.ensure_future(b.command(build("b")))
        await started["b"].wait()  # b stamped and began while a is mid-build
        first, second = (ta, tb) if first_ends == "a" else (tb, ta)
        release[first_ends].set()
        await first
        release["b" if first_ends == "a" else "a"].set()
        await second
        assert command_stamp() is None
        for name, h in (("a", a), ("b", b)):
            stamp = seen[name][0]
            assert stamp is not None and seen[name] == [stamp, stamp]
            assert stamp <= built[name]
            log = named_database(f"trigger-{name}-{first_ends}").session_log("s")
            assert log[-1].topic.endswith("Session.Committed")  # the command's boundary
            writes = [e for e in log if e.topic.endswith("Session.ValueSet")]
            stamps = {json.loads(e.state)["timestamp"]["_data_"] for e in [*writes, log[-1]]}
            assert len(writes) == 2 and stamps == {stamp.isoformat()}, name
            await h.close()
        a_stamp, b_stamp = seen["a"][0], seen["b"][0]
        assert a_stamp is not None and b_stamp is not None and a_stamp <= b_stamp

    asyncio.run(go("a"))
    asyncio.run(go("b"))


def test_a_task_started_inside_a_command_outlives_its_stamp() -> None:
    """An asyncio task created while a command builds inherits its context: once the
    command ends, that task reads no stamp (the clock again), never the old one."""

    async def go() -> None:
        h = await pico.Harness.open("memory://trigger-child", session="s")
        later = asyncio.Event()

        async def child() -> tuple[datetime | None, datetime | None]:
            during = command_stamp()
            await later.wait()
            return during, command_stamp()

        tasks: list[asyncio.Task[tuple[datetime | None, datetime | None]]] = []

        async def build(tx: Any) -> None:
            tasks.append(asyncio.ensure_future(child()))
            await asyncio.sleep(0)  # the child runs while the command builds
            tx.set_value(GLOBAL, 1)

        await h.command(build)
        later.set()
        during, after = await tasks[0]
        assert during is not None and after is None
        await h.close()

    asyncio.run(go())


def test_a_nested_command_stamps_its_own_and_gives_the_outer_back() -> None:
    """A builder that awaits another session's command: the inner command's events carry
    its own, later reading; the outer command's events after it carry the outer one."""

    async def go() -> None:
        a = await pico.Harness.open("memory://trigger-nest-a", session="s")
        b = await pico.Harness.open("memory://trigger-nest-b", session="s")
        seen: list[datetime | None] = []

        async def outer(tx: Any) -> None:
            seen.append(command_stamp())
            tx.set_value(GLOBAL, "before")
            await asyncio.sleep(0.002)
            await b.command(lambda inner: inner.set_value(GLOBAL, "inner"))
            seen.append(command_stamp())
            tx.set_value(GLOBAL, "after")

        await a.command(outer)
        assert command_stamp() is None
        outer_stamp = seen[0]
        assert outer_stamp is not None and seen == [outer_stamp, outer_stamp]
        outer_log = named_database("trigger-nest-a").session_log("s")[-3:]  # 2 writes + boundary
        inner_log = named_database("trigger-nest-b").session_log("s")[-2:]  # 1 write + boundary
        assert {_stamp_of(e) for e in outer_log} == {outer_stamp}
        ((inner_stamp),) = {_stamp_of(e) for e in inner_log}
        assert inner_stamp > outer_stamp
        await a.close()
        await b.close()

    asyncio.run(go())


def test_opening_a_session_inside_a_command_stamps_the_claim_with_its_own_reading() -> None:
    """A builder that opens another session: the claim's batch takes its own reading, not
    the outer command's (which would put it before the session's creation)."""

    async def go() -> None:
        a = await pico.Harness.open("memory://trigger-open-a", session="s")
        opened: list[pico.Harness] = []

        async def build(tx: Any) -> None:
            tx.set_value(GLOBAL, 1)
            await asyncio.sleep(0.002)
            opened.append(await pico.Harness.open("memory://trigger-open-b", session="s"))

        await a.command(build)
        (outer_stamp,) = {
            _stamp_of(e) for e in named_database("trigger-open-a").session_log("s")[-2:]
        }
        log = named_database("trigger-open-b").session_log("s")
        claimed = [e for e in log if e.topic.endswith("Session.Claimed")]
        assert len(claimed) == 1 and _stamp_of(claimed[0]) > outer_stamp
        stamps = [_stamp_of(e) for e in log]
        assert stamps == sorted(stamps)  # creation, claim, then the root's command
        await opened[0].close()
        await a.close()

    asyncio.run(go())


def test_a_command_the_loop_abandoned_is_finalised_quietly() -> None:
    """A loop closed with a command still building: the garbage collector finalises its
    coroutine in another context, where the stamp's token does not apply; nothing is
    reported (pytest turns an unraisable exception into a failure here)."""
    loop = asyncio.new_event_loop()
    h = loop.run_until_complete(pico.Harness.open("memory://trigger-abandoned", session="s"))

    async def build(tx: Any) -> None:
        tx.set_value(GLOBAL, 1)
        await asyncio.Event().wait()

    task = loop.create_task(h.command(build))
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        del task
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert not [u for u in unraisable if isinstance(u.exc_value, ValueError)], unraisable
    assert command_stamp() is None


def _stamp_of(stored: Any) -> datetime:
    return datetime.fromisoformat(json.loads(stored.state)["timestamp"]["_data_"])
