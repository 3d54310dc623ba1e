"""Sequential tool execution (§5.4): the same tools and the same join, chained by ``after``
edges in call order — every backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.application.flows.generation import tool_dependencies
from pico.domain.json import JsonObject
from tests.backends import Backend
from tests.contract.test_agent import SCHEMA, _bounded, _get

CALLS: list[tuple[str, JsonObject]] = [
    ("a", {"path": "1"}),
    ("b", {"path": "2"}),
    ("c", {"path": "3"}),
]


class Gated:
    """Tools ``a``, ``b``, ``c`` that record their start and finish and wait on their own
    gate (or the execution signal) before they return; ``failing`` ones raise."""

    def __init__(self, *, failing: tuple[str, ...] = (), sequential: tuple[str, ...] = ()):
        self.gates = {n: asyncio.Event() for n in "abc"}
        self.events: list[str] = []
        self.failing = failing
        self.sequential = sequential

    def tools(self) -> list[pico.Tool]:
        def make(name: str) -> Any:
            async def run(args: JsonObject, ctx: ToolContext) -> str:
                self.events.append(f"start {name}")
                gate = asyncio.ensure_future(self.gates[name].wait())
                signal = asyncio.ensure_future(ctx.signal.wait())
                await asyncio.wait({gate, signal}, return_when=asyncio.FIRST_COMPLETED)
                gate.cancel()
                signal.cancel()
                self.events.append(f"end {name}")
                if name in self.failing:
                    raise RuntimeError(f"{name} broke")
                return f"{name} result"

            return run

        return [pico.Tool(n, n, SCHEMA, make(n), sequential=n in self.sequential) for n in "abc"]

    def open_all(self) -> None:
        for gate in self.gates.values():
            gate.set()

    async def settle(self, count: int) -> None:
        """Let the drive run until ``count`` events were recorded (bounded, never luck)."""
        for _ in range(2000):
            if len(self.events) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"only {self.events} happened")


def _provider(calls: list[tuple[str, JsonObject]] = CALLS) -> FauxProvider:
    return FauxProvider([FauxResponse(tool_calls=calls), "all three done"])


async def _tools_and_join(h: pico.Harness) -> tuple[list[pico.TaskSnapshot], pico.TaskSnapshot]:
    tools = (await h.tasks(kind="tool", limit=20)).items
    joins = (await h.tasks(kind="post_tools", limit=20)).items
    assert len(joins) == 1
    return list(tools), joins[0]


async def _spin(times: int = 200) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


def test_dependencies_chain_barriers_and_keep_parallel_calls_between_them() -> None:
    assert tool_dependencies([False, False, False]) == [[], [], []]
    assert tool_dependencies([True, True, True]) == [[], [0], [1]]
    # A sequential call waits for every earlier call and every later call waits for it.
    assert tool_dependencies([False, True, False, False]) == [[], [0], [1], [1]]
    assert tool_dependencies([False, False, True]) == [[], [], [0, 1]]
    assert tool_dependencies([True, False, False, True, False]) == [[], [0], [0], [1, 2], [3]]
    assert tool_dependencies([]) == []


async def test_the_sequential_policy_chains_calls_in_call_order_under_the_same_join(
    backend: Backend,
) -> None:
    gated = Gated()
    gated.open_all()
    provider = _provider()
    h = await backend.open(provider=provider, tools=gated.tools(), tool_execution="sequential")
    c = await h.root()
    _, result = await _bounded(c.prompt("run all three"))
    assert result is not None and result.status == "done"
    (a, b, cc), join = await _tools_and_join(h)
    assert [_get(t.state, "name") for t in (a, b, cc)] == ["a", "b", "c"]
    assert (a.after, b.after, cc.after) == ((), (a.id,), (b.id,))
    assert join.after == (a.id, b.id, cc.id)  # the same join as in parallel
    assert gated.events == ["start a", "end a", "start b", "end b", "start c", "end c"]
    kinds = [e.kind for e in (await c.entries()).items]
    assert kinds == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    await h.close()


async def test_a_later_call_does_not_start_before_the_earlier_one_settles(
    backend: Backend,
) -> None:
    gated = Gated()
    h = await backend.open(provider=_provider(), tools=gated.tools(), tool_execution="sequential")
    c = await h.root()
    input_id = await c.accept("one at a time")
    drive = asyncio.ensure_future(c.drive())
    await gated.settle(1)
    await _spin()
    assert gated.events == ["start a"]  # b waits on a's settlement, not on luck
    gated.gates["a"].set()
    await gated.settle(3)
    await _spin()
    assert gated.events == ["start a", "end a", "start b"]
    (a, b, cc), _ = await _tools_and_join(h)
    assert (a.status, b.status, cc.status) == ("done", "running", "pending")
    gated.gates["b"].set()
    gated.gates["c"].set()
    assert await _bounded(drive) == "idle"
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_by_default_the_calls_run_concurrently(backend: Backend) -> None:
    gated = Gated()
    h = await backend.open(provider=_provider(), tools=gated.tools())
    c = await h.root()
    input_id = await c.accept("all at once")
    drive = asyncio.ensure_future(c.drive())
    await gated.settle(3)
    assert sorted(gated.events) == ["start a", "start b", "start c"]  # none finished yet
    (a, b, cc), join = await _tools_and_join(h)
    assert (a.after, b.after, cc.after) == ((), (), ())
    assert join.after == (a.id, b.id, cc.id)
    gated.open_all()
    assert await _bounded(drive) == "idle"
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_a_sequential_tool_is_a_barrier_among_parallel_calls(backend: Backend) -> None:
    gated = Gated(sequential=("b",))
    calls: list[tuple[str, JsonObject]] = [*CALLS, ("c", {"path": "4"})]
    h = await backend.open(provider=_provider(calls), tools=gated.tools())
    c = await h.root()
    input_id = await c.accept("b alone")
    drive = asyncio.ensure_future(c.drive())
    await gated.settle(1)
    await _spin()
    assert gated.events == ["start a"]  # b waits for a; both c calls wait for b
    gated.gates["a"].set()
    await gated.settle(3)
    await _spin()
    assert gated.events == ["start a", "end a", "start b"]
    gated.gates["b"].set()
    await gated.settle(6)
    assert gated.events[4:] == ["start c", "start c"]  # after b, the two c run together
    (a, b, c1, c2), join = await _tools_and_join(h)
    assert (a.after, b.after, c1.after, c2.after) == ((), (a.id,), (b.id,), (b.id,))
    assert join.after == (a.id, b.id, c1.id, c2.id)
    gated.open_all()
    assert await _bounded(drive) == "idle"
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_a_failed_call_still_lets_the_later_calls_run_and_the_join_settle(
    backend: Backend,
) -> None:
    gated = Gated(failing=("a",))
    gated.open_all()
    provider = _provider()
    h = await backend.open(provider=provider, tools=gated.tools(), tool_execution="sequential")
    c = await h.root()
    _, result = await _bounded(c.prompt("a breaks"))
    assert result is not None and result.status == "done"  # dependencies mean terminal
    assert gated.events == ["start a", "end a", "start b", "end b", "start c", "end c"]
    results = [e.content for e in (await c.entries(kind="tool")).items]
    assert [_get(r, "is_error") for r in results] == [True, False, False]
    assert "a broke" in str(results[0])
    (_, join) = await _tools_and_join(h)
    assert join.status == "done"
    assert provider.request_count == 2  # the model saw all three results
    await h.close()


async def test_abort_during_the_first_call_settles_every_call_of_the_chain(
    backend: Backend,
) -> None:
    gated = Gated()
    provider = _provider()
    h = await backend.open(provider=provider, tools=gated.tools(), tool_execution="sequential")
    c = await h.root()
    input_id = await c.accept("stop midway")
    drive = asyncio.ensure_future(c.drive())
    await gated.settle(1)
    marked = await c.abort()  # a is running; b and c wait on it; the join on all three
    (a, b, cc), join = await _tools_and_join(h)
    assert sorted(marked) == sorted([a.id, b.id, cc.id, join.id])
    assert await _bounded(drive) == "idle"
    assert gated.events == ["start a", "end a"]  # b and c never ran
    (a, b, cc), join = await _tools_and_join(h)
    # a returned when signalled: what it did is its result. b and c abort without waiting
    # for their dependency; the join settles without a successor.
    assert [t.status for t in (a, b, cc, join)] == ["done", "aborted", "aborted", "aborted"]
    results = {
        e.metadata["tool_name"]: e.content  # type: ignore[index]
        for e in (await c.entries(kind="tool")).items
    }
    assert results == {  # every call of the response has its result
        "a": {"content": "a result", "is_error": False},
        "b": {"content": "aborted", "is_error": True},
        "c": {"content": "aborted", "is_error": True},
    }
    assert (await c.result(input_id)).status == "cancelled"  # type: ignore[union-attr]
    assert [t.kind for t in (await h.tasks(limit=20)).items].count("generation") == 1
    assert provider.request_count == 1
    await h.close()


async def test_the_policy_is_captured_when_the_generation_is_created(backend: Backend) -> None:
    gated = Gated()
    gated.open_all()
    h = await backend.open(provider=_provider(), tools=gated.tools(), tool_execution="sequential")
    c = await h.root()
    input_id = await c.accept("captured")  # the generation is created now, not driven
    await h.close()
    h = await backend.open(provider=_provider(), tools=gated.tools())  # parallel by default
    await h.acknowledge_configuration()  # the resume gate: tool_execution is blocking
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    (a, b, cc), _ = await _tools_and_join(h)
    assert (a.after, b.after, cc.after) == ((), (a.id,), (b.id,))
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


@pytest.mark.parametrize("value", ["serial", "Sequential", None, 1])
async def test_an_unknown_policy_is_refused_before_anything_opens(
    backend: Backend, value: Any
) -> None:
    with pytest.raises(pico.InvalidArgumentError, match="tool_execution must be one of"):
        await backend.open(provider=_provider(), tool_execution=value)
    h = await backend.open(provider=_provider())  # nothing was created or held
    assert [t.kind for t in (await h.tasks(limit=5)).items] == []
    await h.close()


def test_a_tool_refuses_a_sequential_flag_that_is_not_a_bool() -> None:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        return ""

    with pytest.raises(pico.InvalidArgumentError, match="sequential must be True or False"):
        pico.Tool("t", "t", SCHEMA, run, sequential="yes")  # type: ignore[arg-type]
