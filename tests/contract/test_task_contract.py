"""Durable task records (§5.1-5.3, §5.7, §6.1, §6.6), on memory, SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

import pico
from pico import Command
from tests.backends import Backend
from tests.taskdefs import JobDefinition, definitions

JOB: pico.JsonValue = {"command": "make test"}


async def _open(backend: Backend) -> pico.Harness:
    return await backend.open(definitions=definitions())


async def test_a_task_is_created_with_its_role_derived_from_status(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    head = h.head()
    tid = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB, foreground=True))
    assert tid == head + 1  # a creation's seq is the new task's id
    task = await h.task(tid)
    assert task is not None
    assert (task.kind, task.status, task.role, task.state) == ("job", "planned", "ready", JOB)
    assert task.foreground and not task.abort_requested and task.after == ()
    running = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB, status="running"))
    assert (await h.task(running)).role == "waiting"  # type: ignore[union-attr]
    await h.close()


async def test_invalid_task_writes_are_rejected_without_writing(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    done = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB, status="exited"))
    live = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB))
    head = h.head()
    cases: list[tuple[type[Exception], object]] = [
        (pico.TaskDefinitionError, lambda tx: tx.create_task(c.id, "unknown-kind")),
        (pico.TaskDefinitionError, lambda tx: tx.create_task(c.id, "job", state={"x": 1})),
        (
            pico.TaskDefinitionError,
            lambda tx: tx.create_task(c.id, "job", state=JOB, status="nonsense"),
        ),
        (pico.UnknownTaskError, lambda tx: tx.create_task(c.id, "job", state=JOB, after=[999999])),
        (pico.UnknownConversationError, lambda tx: tx.create_task(99999, "job", state=JOB)),
        (pico.InvalidJsonError, lambda tx: tx.create_task(c.id, "note", state={"x": float("nan")})),
        (pico.TerminalTaskError, lambda tx: tx.patch_task(done, status="killed")),
        (pico.TaskDefinitionError, lambda tx: tx.patch_task(live, status="running")),
        (pico.TaskDefinitionError, lambda tx: tx.patch_task(live, state={"nope": True})),
        (pico.UnknownTaskError, lambda tx: tx.patch_task(424242, status="spawning")),
    ]
    for error, build in cases:
        with pytest.raises(error):
            await h.command(build)  # type: ignore[call-overload]
    assert h.head() == head
    assert (await h.task(live)).status == "planned"  # type: ignore[union-attr]
    await h.close()


async def test_patches_move_status_role_state_and_scheduling(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    tid = await h.command(
        lambda tx: tx.create_task(
            c.id, "job", state=JOB, not_before=100.0, required_permit="deferred-poll"
        )
    )
    await h.command(lambda tx: tx.patch_task(tid, status="spawning"))
    t = await h.task(tid)
    assert t is not None and (t.status, t.role, t.state) == ("spawning", "inflight", JOB)
    assert t.not_before == 100.0 and t.required_permit == "deferred-poll"  # kept
    await h.command(
        lambda tx: tx.patch_task(
            tid, status="running", state={"command": "x"}, not_before=None, required_permit=None
        )
    )
    t = await h.task(tid)
    assert t is not None and (t.role, t.state, t.not_before, t.required_permit) == (
        "waiting",
        {"command": "x"},
        None,
        None,
    )
    await h.command(lambda tx: tx.patch_task(tid, status="exited"))
    t = await h.task(tid)
    assert t is not None and t.role == "terminal" and not t.live
    await h.close()


async def test_dependencies_exist_stay_acyclic_and_are_not_provenance(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()

    def build(tx: Command) -> tuple[int, int, int]:
        a = tx.create_task(c.id, "job", state=JOB)
        b = tx.create_task(c.id, "job", state=JOB, after=[a])
        # spawned_by is provenance only: a task may depend on the task it spawned.
        d = tx.create_task(c.id, "job", state=JOB, after=[b], spawned_by=b)
        return a, b, d

    a, b, d = await h.command(build)
    assert (await h.task(d)).after == (b,)  # type: ignore[union-attr]
    assert (await h.task(d)).spawned_by == b  # type: ignore[union-attr]
    head = h.head()
    with pytest.raises(pico.TaskGraphError):
        await h.command(lambda tx: tx.patch_task(a, after=[d]))  # a -> d -> b -> a
    with pytest.raises(pico.TaskGraphError):
        await h.command(lambda tx: tx.patch_task(a, after=[a]))
    assert h.head() == head
    await h.command(lambda tx: tx.patch_task(d, after=[a, b]))
    assert (await h.task(d)).after == (a, b)  # type: ignore[union-attr]
    await h.close()


async def test_ownership_links_are_reciprocal_and_trees_bound_dependencies(
    backend: Backend,
) -> None:
    h = await _open(backend)
    root = await h.root()

    def spawn(tx: Command) -> tuple[int, int, int]:
        owner = tx.create_task(root.id, "job", state=JOB, foreground=True)
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "job", state=JOB)
        return owner, child, inner

    owner, child, inner = await h.command(spawn)
    snap = await h.get_conversations([child])
    assert snap[child].owner_task_id == owner
    assert (await h.task(owner)).owned_conversation_id == child  # type: ignore[union-attr]
    # Check: a dependency inside one ownership tree is fine ...
    await h.command(lambda tx: tx.create_task(root.id, "job", state=JOB, after=[inner]))
    # ... but a fork is another tree: its work cannot depend on ours.
    m = await root.append("user", "m")
    fork = await root.fork(at_entry=m)
    with pytest.raises(pico.TaskGraphError):
        await h.command(lambda tx: tx.create_task(fork.id, "job", state=JOB, after=[owner]))
    assert (await fork.snapshot()).owner_task_id is None  # fork provenance is not ownership
    await h.close()


async def test_task_queries_filter_before_limit_and_page(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    other = await h.command(lambda tx: tx.create_conversation())

    def build(tx: Command) -> list[int]:
        ids = []
        for i in range(9):
            conv = c.id if i % 3 else other
            kind = "note" if i % 4 == 0 else "job"
            status = "exited" if i % 2 else "planned"
            ids.append(tx.create_task(conv, kind, state=JOB, status=status, foreground=i % 3 == 1))
        return ids

    ids = await h.command(build)
    live = await h.tasks(live=True, limit=100)
    assert [t.id for t in live.items] == [t for i, t in enumerate(ids) if i % 2 == 0]
    terminal = await h.tasks(live=False, limit=100)
    assert [t.id for t in terminal.items] == [t for i, t in enumerate(ids) if i % 2]
    page = await h.tasks(conversation_ids=[c.id], live=True, limit=1)
    expected = [t for i, t in enumerate(ids) if i % 2 == 0 and i % 3]
    assert [t.id for t in page.items] == expected[:1] and page.next == expected[0]
    rest = await h.tasks(conversation_ids=[c.id], live=True, after=page.next, limit=10)
    assert [t.id for t in rest.items] == expected[1:]
    notes = await h.tasks(kind="note", limit=100)
    assert [t.id for t in notes.items] == [t for i, t in enumerate(ids) if i % 4 == 0]
    fg = await h.tasks(foreground=True, role="ready", limit=100)
    assert [t.id for t in fg.items] == [t for i, t in enumerate(ids) if i % 3 == 1 and i % 2 == 0]
    newest = await h.tasks(order="desc", limit=2)
    assert [t.id for t in newest.items] == ids[::-1][:2]
    assert set(await h.get_tasks([ids[0], ids[5], 10**9])) == {ids[0], ids[5]}
    await h.close()


async def test_abort_marks_are_durable_and_never_shrink(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    tid = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB))
    done = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB, status="exited"))
    assert await h.command(lambda tx: tx.request_abort(tid)) is True
    head = h.head()
    assert await h.command(lambda tx: tx.request_abort(tid)) is False  # joins, writes nothing
    assert await h.command(lambda tx: tx.request_abort(done)) is False  # terminal: no mark
    assert h.head() == head
    await h.close()
    h = await _open(backend)
    marked = await h.tasks(abort_requested=True, limit=10)
    assert [t.id for t in marked.items] == [tid]
    await h.close()


async def test_deleting_a_conversation_rejects_while_its_subtree_has_live_work(
    backend: Backend,
) -> None:
    h = await _open(backend)
    root = await h.root()
    a = await h.command(lambda tx: tx.create_conversation())

    def spawn(tx: Command) -> tuple[int, int, int]:
        owner = tx.create_task(a, "job", state=JOB, status="running")
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "job", state=JOB)
        return owner, child, inner

    owner, child, inner = await h.command(spawn)
    await h.command(lambda tx: tx.patch_task(owner, status="exited"))
    # The owner settled, but its owned child still has live work.
    with pytest.raises(pico.LiveWorkError, match=f"owned conversation {child}"):
        await h.delete_conversation(a)
    await h.command(lambda tx: tx.patch_task(inner, status="killed"))
    await h.delete_conversation(a)
    with pytest.raises(pico.ConversationDeletedError):
        await h.command(lambda tx: tx.create_task(a, "job", state=JOB))
    assert root.id != a
    await h.close()


async def test_opening_validates_live_definitions_before_claiming(backend: Backend) -> None:
    h = await _open(backend)
    c = await h.root()
    await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
    old_kind = await h.command(lambda tx: tx.create_task(c.id, "job", state=JOB))
    await h.command(lambda tx: tx.patch_task(old_kind, status="spawning"))
    if backend.exclusive_writer:  # an opener meets the writer's lock first: let it go
        head = h.head()
        await h.close()
        with pytest.raises(pico.TaskDefinitionError, match="'note'"):
            await backend.open(definitions=[JobDefinition()])
        h = await _open(backend)
        assert h.head() == head  # the refused open wrote nothing (a claim takes no number)
        await h.command(lambda tx: tx.patch_task(old_kind, status="lost"))
        await h.close()
        h2 = await backend.open(definitions=definitions()[1:])
        assert (await h2.task(old_kind)).role == "terminal"  # type: ignore[union-attr]
        await h2.close()
        return
    # Check: a missing live kind rejects the open, and the open claimed nothing ...
    with pytest.raises(pico.TaskDefinitionError, match="'note'"):
        await backend.open(definitions=[JobDefinition()])
    await c.append("user", "the owner was not fenced")

    # ... and so does a definition that no longer maps a live status to its stored role.
    class Remapped(JobDefinition):
        roles = {**JobDefinition.roles, "spawning": "waiting"}

    with pytest.raises(pico.TaskDefinitionError, match="role"):
        await backend.open(definitions=[Remapped(), *definitions()[1:]])
    await c.append("user", "still the owner")
    # Terminal tasks of unknown kinds never block an open.
    await h.command(lambda tx: tx.patch_task(old_kind, status="lost"))
    await h.close()
    h2 = await backend.open(definitions=definitions()[1:])
    assert (await h2.task(old_kind)).role == "terminal"  # type: ignore[union-attr]
    await h2.close()


async def test_the_live_set_crosses_its_500_row_pages_and_skips_terminal_work(
    backend: Backend,
) -> None:
    # The scheduler's pass and the open-time validation read live work in pages of 500:
    # every page must be read, in id order, and terminal tasks never appear.
    h = await _open(backend)
    c = await h.root()

    def many(tx: Command) -> list[int]:
        ids = []
        for i in range(1_100):
            status = "exited" if i % 3 == 0 else "planned"
            ids.append(tx.create_task(c.id, "job", state=JOB, status=status))
        return [t for i, t in enumerate(ids) if i % 3]

    live = await h.command(many)
    assert len(live) > 500 * 1.4
    assert [t.id for t in (await h.inspect())["ready"]] == live
    await h.close()
    h = await _open(backend)  # the open validates the whole live set, too
    assert [t.id for t in (await h.inspect())["ready"]] == live
    await h.close()
