"""§10.1: randomized histories applied to every backend, compared with a replay of the
same stored events through the pure projector into the in-memory read model (the oracle).

The comparison covers current conversations, transcript pages with inherited prefixes,
historical contexts at every main boundary and the next allocated sequence, after a
close/reopen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pico
from pico.infrastructure.storage import EventSourcedStorage
from pico.infrastructure.verify import replayed_read_store
from pico.projections.queries import Queries, StateQueries, TaskQueries
from tests.backends import BACKENDS, make_backend, require_postgres
from tests.taskdefs import JobDefinition, definitions

# One step of a history: (operation, conversation pick, argument picks).
step = st.tuples(
    st.sampled_from(
        [
            "append",
            "multi",
            "note",
            "context_only",
            "compact",
            "reset",
            "reset_empty",
            "fork_entry",
            "fork_boundary",
            "tool_exchange",
            "bad_append",
            "delete",
            "value_set",
            "value_delete",
            "sticky_set",
            "list_append",
            "list_clear",
            "sticky_list",
            "session_set",
            "value_only",
            "fork_independent",
            "fork_chain",
            "bad_policy",
            "task_create",
            "task_patch",
            "task_abort",
        ]
    ),
    st.integers(min_value=0, max_value=50),
    st.integers(min_value=0, max_value=50),
)


PLAN = pico.conversation_value("plugin.plan", int)
EXPANDED = pico.conversation_value("ui.expanded", bool, rewind=False)
MOVES = pico.conversation_list("game.moves", int)
NOTES = pico.conversation_list("ui.notes", int, rewind=False)
NAME = pico.session_value("app.name", int)
TAGS = pico.session_list("app.tags", int)

# Every operation at least once, forks of forks, compaction after a fork, deletes.
RICH_HISTORY = [
    ("append", 0, 1),
    ("multi", 0, 2),
    ("append", 0, 3),
    ("tool_exchange", 0, 4),
    ("fork_entry", 0, 2),
    ("compact", 0, 1),
    ("append", 1, 5),
    ("note", 1, 2),
    ("fork_boundary", 1, 0),
    ("compact", 1, 2),
    ("multi", 2, 1),
    ("reset", 0, 0),
    ("context_only", 0, 0),
    ("fork_entry", 2, 3),
    ("bad_append", 1, 0),
    ("compact", 2, 1),
    ("reset_empty", 1, 0),
    ("append", 1, 6),
    ("delete", 3, 0),
    ("append", 3, 1),
    ("compact", 0, 0),
    ("append", 0, 9),
    ("tool_exchange", 2, 7),
    ("compact", 2, 2),
    ("value_set", 0, 1),
    ("list_append", 0, 1),
    ("value_only", 0, 2),
    ("fork_entry", 0, 9),
    ("value_delete", 0, 0),
    ("list_clear", 0, 0),
    ("list_append", 0, 3),
    ("fork_chain", 4, 2),
    ("sticky_set", 4, 1),
    ("sticky_list", 4, 1),
    ("session_set", 0, 4),
    ("value_set", 5, 8),
    ("fork_independent", 0, 1),
    ("list_append", 6, 5),
    ("value_set", 0, 7),
    ("bad_policy", 0, 0),
    ("task_create", 0, 1),
    ("task_create", 1, 2),
    ("task_patch", 0, 1),
    ("task_abort", 0, 2),
    ("task_patch", 0, 3),
    ("task_create", 2, 4),
    ("task_abort", 0, 5),  # last, so no later patch hides a stale abort projection
]


def _create_task(cid: int, arg: int, deps: list[int]) -> Callable[[pico.Command], int]:
    def build(tx: pico.Command) -> int:
        return tx.create_task(
            cid,
            "job",
            state={"command": f"c{arg}"},
            after=deps,
            foreground=arg % 2 == 0,
            not_before=float(arg) if arg % 5 == 0 else None,
        )

    return build


def _patch_task(task_id: int, status: str) -> Callable[[pico.Command], None]:
    return lambda tx: tx.patch_task(task_id, status=status, state={"command": status})


def _abort_task(task_id: int) -> Callable[[pico.Command], bool]:
    return lambda tx: tx.request_abort(task_id)


async def _apply(h: pico.Harness, steps: list[tuple[str, int, int]]) -> None:
    convs = [(await h.root()).id]
    for op, pick, arg in steps:
        cid = convs[pick % len(convs)]
        c = pico.ConversationHandle(h, cid)
        try:
            if op == "append":
                await c.append("user", f"text {arg}")
            elif op == "multi":

                def build(tx: pico.Command, cid: int = cid, n: int = arg % 3 + 2) -> None:
                    ids = [tx.append_entry(cid, "user", {"i": i}) for i in range(n)]
                    tx.append_context(cid, ids)

                await h.command(build)
            elif op == "note":
                await c.append("note", None, select=False, key=f"k{arg % 3}")
            elif op == "context_only":
                page = await c.entries(order="desc", limit=1)
                if page.items:
                    await c.append_context([page.items[0].id])
            elif op in ("compact", "reset"):
                ctx = (await c.snapshot()).context
                if ctx:
                    through = ctx[arg % len(ctx)]
                    if op == "compact":
                        await c.compact(f"summary {arg}", through=through)
                    else:
                        await c.handoff(f"handoff {arg}")
            elif op == "reset_empty":
                await c.reset_context([])
            elif op == "fork_entry":
                page = await c.entries(limit=1000)
                if page.items:
                    target = page.items[arg % len(page.items)].id
                    convs.append((await c.fork(at_entry=target)).id)
            elif op == "fork_boundary":
                convs.append((await c.fork(as_of=h.main_head())).id)
            elif op == "tool_exchange":
                await c.append("assistant", "call", metadata={"tool_calls": [f"c{arg}"]})
                await c.append("tool", "result", metadata={"tool_call_id": f"c{arg}"})
            elif op == "bad_append":
                await c.append_context([10**9])
            elif op == "delete" and cid != convs[0]:
                await h.delete_conversation(cid)
            elif op == "value_set":
                await c.set_value(PLAN, arg)
            elif op == "value_delete":
                await c.delete_value(PLAN)
            elif op == "sticky_set":
                await c.set_value(EXPANDED, arg % 2 == 0)
            elif op == "list_append":
                await c.append_list(MOVES, arg)
            elif op == "list_clear":
                await c.clear_list(MOVES)
            elif op == "sticky_list":
                if arg % 3 == 0:
                    await c.clear_list(NOTES)
                else:
                    await c.append_list(NOTES, arg)
            elif op == "session_set":
                await h.set_value(NAME, arg)
                await h.append_list(TAGS, arg)
            elif op == "value_only":

                def values(tx: pico.Command, cid: int = cid, n: int = arg) -> None:
                    tx.set_value(PLAN, n, conversation_id=cid)
                    tx.append_list(MOVES, n, conversation_id=cid)
                    tx.append_list(MOVES, n + 1, conversation_id=cid)
                    if n % 2:
                        tx.clear_list(MOVES, conversation_id=cid)
                    tx.set_value(EXPANDED, True, conversation_id=cid)

                await h.command(values)
            elif op == "fork_independent":
                convs.append((await c.fork(as_of=h.main_head(), inherit_state=False)).id)
            elif op == "fork_chain":
                cur = c
                for _ in range(arg % 4 + 2):
                    await cur.set_value(PLAN, arg)
                    cur = await cur.fork(as_of=h.main_head(), sticky=[EXPANDED])
                    convs.append(cur.id)
            elif op == "task_create":
                tasks = (await h.tasks(live=True, limit=1000)).items
                deps = [t.id for t in tasks if t.conversation_id == cid][: arg % 3]
                await h.command(_create_task(cid, arg, deps))
            elif op == "task_patch":
                tasks = (await h.tasks(live=True, limit=1000)).items
                if tasks:
                    t = tasks[arg % len(tasks)]
                    nxt = JobDefinition.transitions.get(t.status, [])
                    if nxt:
                        await h.command(_patch_task(t.id, nxt[arg % len(nxt)]))
            elif op == "task_abort":
                tasks = (await h.tasks(live=True, limit=1000)).items
                if tasks:
                    await h.command(_abort_task(tasks[arg % len(tasks)].id))
            elif op == "bad_policy":
                await c.set_value(pico.conversation_value("plugin.plan", int, rewind=False), 1)
        except pico.CommandRejectedError:
            pass  # rejected commands must leave no trace; the comparison checks it


def _oracle(storage: EventSourcedStorage) -> tuple[Queries, StateQueries, TaskQueries]:
    store = replayed_read_store(storage.session_id, storage.replay())
    return Queries(store), StateQueries(store), TaskQueries(store)


def _state_view(sq: StateQueries, ids: list[int], boundaries: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "session name": sq.get_value("session", NAME.namespace, "", rewind=False),
        "session tags": sq.read_list("session", TAGS.namespace, "", rewind=False, limit=1000),
        "session scan": sq.scan_values("session", limit=1000),
    }
    for cid in ids:
        scope = f"conversation/{cid}"
        out[f"expanded {cid}"] = sq.get_value(scope, EXPANDED.namespace, "", rewind=False)
        out[f"notes {cid}"] = sq.read_list(scope, NOTES.namespace, "", rewind=False, limit=1000)
        out[f"scan {cid}"] = sq.scan_values(scope, limit=1000)
        for p in [None, *boundaries]:
            out[f"plan {cid}@{p}"] = sq.get_value(scope, PLAN.namespace, "", rewind=True, as_of=p)
            out[f"moves {cid}@{p}"] = sq.read_list(
                scope, MOVES.namespace, "", rewind=True, as_of=p, limit=1000
            )
            out[f"moves desc {cid}@{p}"] = sq.read_list(
                scope, MOVES.namespace, "", rewind=True, as_of=p, order="desc", limit=2
            )
    return out


def _task_view(tq: TaskQueries) -> dict[str, Any]:
    everything = tq.scan_tasks(limit=1000)
    ids = [t.id for t in everything.items]
    return {
        "tasks": everything,
        "live tasks": tq.scan_tasks(live=True, limit=1000),
        "terminal tasks": tq.scan_tasks(live=False, order="desc", limit=1000),
        "marked": tq.scan_tasks(abort_requested=True, limit=1000),
        "foreground waiting": tq.scan_tasks(foreground=True, role="waiting", limit=1000),
        "by id": tq.get_tasks(ids),
    }


def _view(q: Any, ids: list[int], boundaries: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"meta": q.meta()}
    out["conversations"] = q.get_conversations(ids)
    for cid in ids:
        out[f"transcript {cid}"] = q.scan_entries(cid, limit=1000, content=True)
        out[f"desc {cid}"] = q.scan_entries(cid, order="desc", limit=3)
        for p in boundaries:
            try:
                out[f"ctx {cid}@{p}"] = q.context_as_of(cid, p)
                out[f"conv {cid}@{p}"] = q.get_conversations([cid], as_of=p)
            except pico.InvalidPositionError:
                out[f"ctx {cid}@{p}"] = "absent"
    out["scan"] = q.scan_conversations(limit=1000)
    return out


async def _check(url: str, session: str, steps: list[tuple[str, int, int]]) -> None:
    h = await pico.Harness.open(url, session=session, definitions=definitions())
    await _apply(h, steps)
    head = h.head()
    await h.close()
    h = await pico.Harness.open(
        url, session=session, definitions=definitions()
    )  # compare after reopen
    storage = h._line.storage
    assert isinstance(storage, EventSourcedStorage)
    ids = [s.id for s in (await h.conversations(limit=1000)).items]
    boundaries = sorted(
        {
            r.payload["last"]
            for r in h.audit(limit=100000)
            if r.event == "Session.Committed" and isinstance(r.payload["last"], int)
        }
    )
    assert h.head() == head == (boundaries[-1] if boundaries else 0)
    queries, state, tasks = _oracle(storage)
    backend_view = _view(storage.queries, ids, boundaries)
    oracle_view = _view(queries, ids, boundaries)
    backend_view.update(_state_view(storage.state_queries, ids, boundaries))
    if steps is RICH_HISTORY:  # guard against a history that silently wrote nothing
        events = {r.event for r in h.audit(limit=100000)}
        assert {
            "Conversation.ValueSet",
            "Conversation.ValueDeleted",
            "Conversation.ListCleared",
            "Session.ValueSet",
            "Conversation.ContextPrefixReplaced",
            "Task.Created",
            "Task.Patched",
            "Task.AbortRequested",
        } <= events
    oracle_view.update(_state_view(state, ids, boundaries))
    backend_view.update(_task_view(storage.task_queries))
    oracle_view.update(_task_view(tasks))
    # Everything, including the owner of the latest claim, must be equal.
    assert backend_view.keys() == oracle_view.keys()
    for k in backend_view:
        assert backend_view[k] == oracle_view[k], k
    # Check: ``pico check`` finds nothing wrong in any history pico itself wrote.
    report = await pico.check(url, session=session)
    assert report.ok, [str(f) for f in report.findings]
    await h.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_random_histories_match_the_oracle(
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if name == "postgresql":
        require_postgres("the oracle")
    counter = iter(range(10**6))

    @settings(
        max_examples=25 if name != "memory" else 60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(step, min_size=6, max_size=40))
    @example(RICH_HISTORY)
    def run(steps: list[tuple[str, int, int]]) -> None:
        b = make_backend(name, tmp_path_factory.mktemp("oracle"))
        asyncio.run(_check(b.url, f"oracle-{next(counter)}-{b.session}", steps))

    run()
