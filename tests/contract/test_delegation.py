"""Tool delegation (§5.5, §5.6, §6.4, §6.5, §9.3): a tool returning ``ToolDelegation``
continues its call as a subagent, in the foreground (the call finishes with the child's
answer) or the background (the call's result names the subagent at once). Every backend;
the child's model request is held by a barrier so each durable state can be read."""

from __future__ import annotations

import asyncio
from typing import Any

import pico
from pico import FauxFailure, FauxProvider, FauxResponse
from tests.backends import Backend
from tests.contract.test_subagents import GatedProvider

READ_SCHEMA: pico.JsonObject = {"type": "object"}


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


async def _read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    return "file contents"


def _call(prompt: str = "child work", **options: Any) -> FauxResponse:
    return FauxResponse(tool_calls=[("subagent", {"prompt": prompt, **options})])


async def _open(backend: Backend, provider: Any, **kwargs: Any) -> pico.Harness:
    tools = [pico.subagent_tool(), pico.Tool("read", "Read", READ_SCHEMA, _read)]
    return await backend.open(provider=provider, tools=tools, **kwargs)


async def _tasks(h: pico.Harness, conversation: int, kind: str) -> list[pico.TaskSnapshot]:
    return list((await h.tasks(conversation_ids=[conversation], kind=kind)).items)


async def _tool_results(c: pico.ConversationHandle) -> list[Any]:
    return [e.content for e in await c.context_entries() if e.kind == "tool"]


async def test_a_foreground_delegation_finishes_the_call_with_the_childs_answer(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider([_call(), "the tests pass", "all done"]), "child work")
    h = await _open(backend, provider)
    c = await h.root()
    question = await c.accept("check the tests")
    drive = asyncio.ensure_future(c.drive())  # the conversation drive covers the child
    await provider.entered.wait()
    # ONE command: { create S; tool finishing after:[S] }
    (tool,) = await _tasks(h, c.id, "tool")
    (owner,) = await _tasks(h, c.id, "subagent")
    assert tool.status == "finishing" and tool.after == (owner.id,)
    assert _state(tool)["finish"] == {"subagent": owner.id}
    assert owner.foreground is True and owner.spawned_by == tool.id
    assert owner.status == "waiting"
    (join,) = await _tasks(h, c.id, "post_tools")
    assert join.live  # the exchange cannot finish until S settles
    assert not drive.done()
    provider.release.set()
    assert await asyncio.wait_for(drive, 5) == "idle"
    owner = await h.task(owner.id)  # type: ignore[assignment]
    assert owner.status == "done"
    tool = await h.task(tool.id)  # type: ignore[assignment]
    assert tool.status == "done"
    assert await _tool_results(c) == [{"content": "the tests pass", "is_error": False}]
    details = _state(tool)["details"]
    assert details["subagent"] == owner.id
    assert details["entry_id"] == _state(owner)["result"]["entry_id"]
    result = await c.result(question)
    assert result is not None and result.status == "done"
    answer = await h.entry(result.entry_id or 0)
    assert answer is not None and answer.content == {"text": "all done"}
    await h.close()


async def test_a_background_delegation_settles_the_call_at_once(backend: Backend) -> None:
    provider = GatedProvider(
        FauxProvider([_call(background=True), "started it", "the tests pass"]), "child work"
    )
    h = await _open(backend, provider)
    c = await h.root()
    question = await c.accept("check the tests")
    session = asyncio.ensure_future(h.drive())
    await provider.entered.wait()  # the child is working ...
    # ... while the parent's exchange already went on: { create S; result naming S; settle }
    (tool,) = await _tasks(h, c.id, "tool")
    (owner,) = await _tasks(h, c.id, "subagent")
    assert tool.status == "done" and tool.after == ()
    assert owner.foreground is False and owner.status == "waiting"
    assert await _tool_results(c) == [
        {"content": f"started subagent task {owner.id} in the background", "is_error": False}
    ]
    assert _state(tool)["details"]["subagent"] == owner.id
    for _ in range(100):
        await asyncio.sleep(0)
    result = await c.result(question)
    assert result is not None and result.status == "done"  # not waiting for the child
    assert await asyncio.wait_for(c.drive(), 5) == "idle"
    provider.release.set()
    assert await asyncio.wait_for(session, 5) == "idle"
    owner = await h.task(owner.id)  # type: ignore[assignment]
    assert owner.status == "done"
    await h.close()


async def test_an_inherited_delegation_context_leaves_out_the_launching_call(
    backend: Backend,
) -> None:
    inner = FauxProvider([_call(context="inherit"), "the tests pass", "all done"])
    h = await _open(backend, inner)
    c = await h.root()
    await c.accept("check the tests")
    assert await c.drive() == "idle"
    (owner,) = await _tasks(h, c.id, "subagent")
    kid = await h.conversation(owner.owned_conversation_id or 0)
    assert kid is not None
    entries = await kid.context_entries()
    # The parent's question, then the child's own prompt and answer: never the assistant
    # entry whose call launched it (an unresolved call).
    assert [(e.kind, e.conversation_id) for e in entries] == [
        ("user", c.id),
        ("user", kid.id),
        ("assistant", kid.id),
    ]
    child_texts = "".join(m.text for m in inner.requests[1].messages)
    assert "check the tests" in child_texts and "child work" in child_texts
    await h.close()


async def test_a_failed_child_is_the_calls_error_result_and_after_tool_sees_it(
    backend: Backend,
) -> None:
    seen: list[tuple[str, bool]] = []

    async def after(call: pico.ToolCall, outcome: pico.ToolOutcome) -> pico.ToolOutcome:
        seen.append((outcome.text, outcome.is_error))
        return outcome

    provider = FauxProvider([_call(), FauxFailure("fatal", "the model refused"), "ok"])
    h = await _open(backend, provider, hooks=pico.Hooks(after_tool=after))
    c = await h.root()
    await c.accept("check the tests")
    assert await c.drive() == "idle"
    (result,) = await _tool_results(c)
    assert result["is_error"] is True
    assert result["content"].startswith("the subagent failed")
    assert "the model refused" in result["content"]
    assert seen == [(result["content"], True)]  # the result hooks ran on the finishing outcome
    await h.close()


async def test_aborting_the_parent_cancels_a_foreground_child_and_its_call(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider([_call(), "never published"]), "child work")
    h = await _open(backend, provider)
    c = await h.root()
    question = await c.accept("check the tests")
    drive = asyncio.ensure_future(c.drive())
    await provider.entered.wait()
    (tool,) = await _tasks(h, c.id, "tool")
    (owner,) = await _tasks(h, c.id, "subagent")
    child = owner.owned_conversation_id or 0
    (generation,) = await _tasks(h, child, "generation")
    marked = await c.abort()
    assert {tool.id, owner.id, generation.id} <= set(marked)  # required through S
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(owner.id)).status == "aborted"  # type: ignore[union-attr]
    assert (await h.task(tool.id)).status == "aborted"  # type: ignore[union-attr]
    assert (await h.task(generation.id)).status == "aborted"  # type: ignore[union-attr]
    assert (await c.result(question)).status == "cancelled"  # type: ignore[union-attr]
    (result,) = await _tool_results(c)
    assert result == {"content": "aborted", "is_error": True}  # the call's required record
    await h.close()


async def test_aborting_the_child_directly_finishes_the_call_with_the_cancellation(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider([_call(), "never published", "carried on"]), "child work")
    h = await _open(backend, provider)
    c = await h.root()
    question = await c.accept("check the tests")
    drive = asyncio.ensure_future(c.drive())
    await provider.entered.wait()
    (owner,) = await _tasks(h, c.id, "subagent")
    kid = await h.conversation(owner.owned_conversation_id or 0)
    assert kid is not None
    marked = await kid.abort()
    assert owner.id in marked  # the owner completes as cancelled (§6.5) ...
    (tool,) = await _tasks(h, c.id, "tool")
    assert tool.id not in marked  # ... the parent's call is not cancelled
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(owner.id)).status == "aborted"  # type: ignore[union-attr]
    (result,) = await _tool_results(c)
    assert result["is_error"] is True and result["content"].startswith("the subagent was cancelled")
    answer = await c.result(question)
    assert answer is not None and answer.status == "done"  # the exchange went on
    await h.close()


async def test_recovery_of_a_foreground_delegation_drives_the_existing_child(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider([_call()]), "child work")
    h = await _open(backend, provider)
    c = await h.root()
    question = await c.accept("check the tests")
    drive = asyncio.ensure_future(c.drive())
    await provider.entered.wait()
    (owner,) = await _tasks(h, c.id, "subagent")
    await h.close()  # the process ends between the launch and the child's answer
    await asyncio.gather(drive, return_exceptions=True)
    h = await _open(backend, FauxProvider(["the tests pass", "all done"]))
    c = await h.root()
    assert await c.drive() == "idle"
    assert len(await _tasks(h, c.id, "subagent")) == 1  # never relaunched
    assert (await h.task(owner.id)).status == "done"  # type: ignore[union-attr]
    assert await _tool_results(c) == [{"content": "the tests pass", "is_error": False}]
    assert (await c.result(question)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_a_delegation_the_subagent_flow_refuses_is_an_error_result(
    backend: Backend,
) -> None:
    async def bad(args: pico.JsonObject, ctx: pico.ToolContext) -> pico.ToolDelegation:
        return pico.ToolDelegation(prompt="x", tools=("no-such-tool",))

    provider = FauxProvider([FauxResponse(tool_calls=[("bad", {})]), "ok"])
    h = await backend.open(provider=provider, tools=[pico.Tool("bad", "Bad", READ_SCHEMA, bad)])
    c = await h.root()
    await c.accept("go")
    assert await c.drive() == "idle"
    (result,) = await _tool_results(c)
    assert result["is_error"] is True and "not registered" in result["content"]
    assert not await _tasks(h, c.id, "subagent")  # nothing was created
    await h.close()


def test_the_shipped_subagent_tool_describes_its_parameters() -> None:
    tool = pico.subagent_tool()
    spec = tool.spec
    assert spec.name == "subagent" and spec.description
    assert spec.parameters["required"] == ["prompt"]
    assert tool.validate({"prompt": "x", "context": "inherit", "background": True})
    bads: list[pico.JsonValue] = [
        {},
        {"prompt": 3},
        {"prompt": "x", "context": "both"},
        {"prompt": "x", "y": 1},
    ]
    for bad in bads:
        try:
            tool.validate(bad)
        except pico.ToolArgumentsError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_a_malformed_delegation_is_refused_where_it_is_built() -> None:
    notes = pico.conversation_list("app.notes", str)
    for build in (
        lambda: pico.ToolDelegation(prompt="x", tools="read"),  # type: ignore[arg-type]
        lambda: pico.ToolDelegation(prompt="x", context="both"),
        lambda: pico.ToolDelegation(prompt="x", background=1),  # type: ignore[arg-type]
        lambda: pico.ToolDelegation(prompt="x", values=5),  # type: ignore[arg-type]
        lambda: pico.subagent_tool(tools="read"),
        lambda: pico.subagent_tool(context="both"),
    ):
        try:
            build()
        except pico.InvalidArgumentError:
            continue
        raise AssertionError("accepted")
    try:
        pico.ToolDelegation(prompt="x", values=pico.Initialization.of([notes]))
    except pico.AddressPolicyError:
        pass
    else:
        raise AssertionError("a list address was accepted")
    try:
        pico.ToolDelegation(prompt=float("nan"))
    except pico.InvalidJsonError:
        pass
    else:
        raise AssertionError("a NaN prompt was accepted")
