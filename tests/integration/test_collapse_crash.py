"""A process SIGKILLed while a collapse is in flight (§8.5): once its complete candidate
(summary and reported usage) is durable, the next owner publishes that candidate without
asking the summarizer again and with the usage recorded once; killed before that, the
next owner asks the summarizer again, once."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap

import pico
from tests.backends import Backend
from tests.contract.test_collapse_recovery import Summarizer
from tests.processes import spawn_child

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    import pico
    from pico.infrastructure.container import open_storage
    from tests.contract.test_collapse_recovery import DiesBeforePublishing, Summarizer

    def hang():
        # The candidate's command is durable; the publication's write never starts.
        print("candidate", flush=True)
        time.sleep(3600)  # SIGKILLed here

    async def announce(provider):
        await provider.started.wait()
        print("summarizing", flush=True)  # the summarizer has not answered: no candidate

    async def main(url, session, when):
        storage = DiesBeforePublishing(
            open_storage(url, session=session, durability=None, read_only=False), hang
        )
        if when == "after-candidate":
            provider = Summarizer("the recorded summary", pico.Usage(120, 30))
        else:
            provider = Summarizer(hold=True)
        h = await pico.Harness.open(storage, provider=provider)
        c = await h.root()
        for i in range(3):
            await c.append("user", f"question {i}")
            await c.append("assistant", {"text": f"answer {i}"})
        storage.watch = await c.collapse()
        if provider.hold:
            asyncio.ensure_future(announce(provider))
        await c.drive()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


async def _kill_collapsing_child(backend: Backend, when: str, expect: str) -> None:
    proc = spawn_child(CHILD, backend.url, backend.session, when)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
        assert line.strip() == expect
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


async def _the_summarizing_collapse(h: pico.Harness) -> pico.TaskSnapshot:
    (collapse,) = (await h.tasks(kind="collapse", limit=5)).items
    assert collapse.status == "summarizing"  # the crash left it in flight
    assert isinstance(collapse.state, dict)
    return collapse


async def test_a_candidate_durable_before_the_kill_is_published_by_the_next_owner(
    sql_backend: Backend,
) -> None:
    await _kill_collapsing_child(sql_backend, "after-candidate", "candidate")
    fresh = Summarizer("a second summary that must not be asked for")
    h = await sql_backend.open(provider=fresh)
    collapse = await _the_summarizing_collapse(h)
    assert collapse.state["summary"] == "the recorded summary"  # type: ignore[index,call-overload]
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert fresh.requests == []
    done = await h.task(collapse.id)
    assert done is not None and done.status == "done" and isinstance(done.state, dict)
    assert done.state["usage"] == {"input": 120, "output": 30}
    context = await c.context_entries()
    assert [e.kind for e in context] == ["summary", "user", "assistant"]
    assert context[0].content == "the recorded summary"
    await h.close()


async def test_a_kill_before_the_candidate_asks_the_summarizer_again_once(
    sql_backend: Backend,
) -> None:
    await _kill_collapsing_child(sql_backend, "before-candidate", "summarizing")
    fresh = Summarizer("the retried summary", pico.Usage(50, 10))
    h = await sql_backend.open(provider=fresh)
    collapse = await _the_summarizing_collapse(h)
    assert "summary" not in collapse.state  # type: ignore[operator]
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert len(fresh.requests) == 1
    done = await h.task(collapse.id)
    assert done is not None and done.status == "done" and isinstance(done.state, dict)
    assert done.state["usage"] == {"input": 50, "output": 10} and done.state["attempt"] == 1
    assert (await c.context_entries())[0].content == "the retried summary"
    await h.close()
