"""A process killed between an effect's durable intent and its outcome: the next owner
recovers the task (never re-executes it)."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap

from tests.backends import Backend
from tests.processes import spawn_child
from tests.scheddefs import Scripted

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import pico
    from tests.scheddefs import Scripted

    async def main(url, session):
        work = Scripted()

        async def intent_then_hang(task, ctx):
            await ctx.command(lambda tx: tx.patch_task(task.id, status="started"))
            print("intent", task.id, flush=True)
            await asyncio.Event().wait()  # the external effect; the process dies here

        work.on_execute = intent_then_hang
        h = await pico.Harness.open(url, session=session, definitions=[work])
        c = await h.root()
        await h.command(lambda tx: tx.create_task(c.id, "work", foreground=True))
        await c.drive()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_process_killed_mid_effect_leaves_work_to_recover(sql_backend: Backend) -> None:
    proc = spawn_child(CHILD, sql_backend.url, sql_backend.session)
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
    tid = int(line.split()[1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    work = Scripted()
    h = await sql_backend.open(definitions=[work])
    assert (await h.task(tid)).status == "started"  # type: ignore[union-attr]
    assert await asyncio.wait_for((await h.root()).drive(), timeout=10) == "idle"
    assert work.calls == [("recover", tid)]
    assert (await h.task(tid)).status == "done"  # type: ignore[union-attr]
    await h.close()
