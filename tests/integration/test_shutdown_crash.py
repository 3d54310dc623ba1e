"""A process killed during shutdown, right after its cancellation command commits (§6.6):
the marks and the cancelled queue are durable, and the next owner's drive settles
everything as cancelled. Real databases, a real process, a real SIGKILL."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap

import pico
from pico import FauxProvider
from tests.backends import Backend
from tests.contract.test_agent import SCHEMA
from tests.processes import spawn_child
from tests.scheddefs import Scripted

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    import pico
    from tests.contract.test_agent import SCHEMA
    from tests.scheddefs import Scripted

    async def main(url, session):
        started = asyncio.Event()

        async def block(args, ctx):
            started.set()
            await asyncio.Event().wait()  # an external effect still running at shutdown

        work = Scripted()
        work.on_recover = lambda task, ctx: asyncio.sleep(0)  # waiting stays waiting
        provider = pico.FauxProvider(
            [pico.FauxResponse(tool_calls=[("block", {"path": "x"})])]
        )
        tool = pico.Tool("block", "Block", SCHEMA, block)
        h = await pico.Harness.open(
            url, session=session, provider=provider, tools=[tool], definitions=[work]
        )
        c = await h.root()
        first = await c.append("user", "before the fork")
        fork = await c.fork(at_entry=first)

        def plan(tx):
            tx.create_task(fork.id, "work", status="waiting", foreground=True)
            tx.create_task(c.id, "work", status="waiting")  # background
            owner = tx.create_task(c.id, "work", status="waiting")
            child = tx.create_owned_conversation(owner)
            tx.create_task(child, "work", status="waiting", foreground=True)

        await h.command(plan)
        turn = await c.accept("start the turn")
        drive = asyncio.ensure_future(c.drive())
        await started.wait()
        inputs = {"turn": turn}
        for name, handle in (("root", c), ("fork", fork)):
            inputs[name + " steer"] = await handle.steer("s")
            inputs[name + " follow_up"] = await handle.follow_up("f")
            inputs[name + " next_run"] = await handle.next_run("n")
            inputs[name + " write"] = await handle.append_message("w")
        live = [t.id for t in (await h.tasks(live=True, limit=1000)).items]
        entries = {
            str(x.id): [e.id for e in (await x.entries(limit=1000)).items] for x in (c, fork)
        }

        async def killed_after_the_marks(conversation_id=None, **kw):
            # shutdown() calls this right after its cancellation command is durable, before
            # any settlement runs: the process dies exactly there.
            print(json.dumps({"inputs": inputs, "live": live, "entries": entries}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        h.scheduler.drive = killed_after_the_marks
        await h.shutdown()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_process_killed_after_the_shutdown_marks_is_settled_by_the_next_owner(
    sql_backend: Backend,
) -> None:
    proc = spawn_child(CHILD, sql_backend.url, sql_backend.session)
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=60)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    seen = json.loads(line)
    inputs: dict[str, int] = seen["inputs"]
    live: list[int] = seen["live"]
    entries: dict[str, list[int]] = seen["entries"]
    assert len(live) == 6  # tool, join, fork work, background, owner, owned child work

    async def block(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        raise AssertionError("a marked tool is aborted, never run again")

    h = await sql_backend.open(
        provider=FauxProvider([]),
        tools=[pico.Tool("block", "Block", SCHEMA, block)],
        definitions=[Scripted()],
    )
    c = await h.root()
    # Check: the one cancellation command survived the kill; nothing settled after it.
    tasks = await h.get_tasks(live)
    assert all(t.live and t.abort_requested for t in tasks.values())
    for name, input_id in inputs.items():
        result = await c.result(input_id)
        assert result is not None
        if name == "turn":
            assert result.status == "running"  # its chain settles it, not the queue
        else:
            assert (result.status, result.reason) == ("cancelled", "shutdown"), name

    assert await asyncio.wait_for(h.drive(), timeout=20) == "idle"
    assert not (await h.tasks(live=True)).items
    assert {t.status for t in (await h.get_tasks(live)).values()} == {"aborted"}
    turn = await c.result(inputs["turn"])
    assert turn is not None and turn.status == "cancelled"
    for cid, ids in entries.items():
        now = [e for e in (await h.entries(int(cid), limit=1000)).items]
        assert [e.id for e in now][: len(ids)] == ids  # every admission entry is still there
        added = [e.kind for e in now[len(ids) :]]
        assert added == (["tool"] if int(cid) == c.id else [])  # the aborted call's result
    await h.close()
