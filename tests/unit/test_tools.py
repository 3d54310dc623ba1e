"""Tools: schema checks, validation before invocation, bounded output, control intents."""

from __future__ import annotations

import pytest

import pico
from pico.application.tools import Tool, ToolArgumentsError, ToolContext, ToolRegistry
from pico.domain.json import JsonObject

READ_SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "lines": {"type": "integer", "minimum": 1}},
    "required": ["path"],
    "additionalProperties": False,
}


def _read_tool(calls: list[JsonObject]) -> Tool:
    async def execute(args: JsonObject, ctx: ToolContext) -> str:
        calls.append(args)
        await ctx.write(f"reading {args['path']}\n")
        return "contents"

    return Tool("read", "Read a file", READ_SCHEMA, execute, replay="safe")


async def test_valid_arguments_invoke_the_tool() -> None:
    calls: list[JsonObject] = []
    tool = _read_tool(calls)
    outcome = await tool.run(
        {"path": "a.py", "lines": 3}, ToolContext(call_id="c1", tool_name="read")
    )
    assert calls == [{"path": "a.py", "lines": 3}]
    assert outcome.text == "reading a.py\ncontents" and not outcome.is_error
    assert tool.spec == pico.ToolSpec("read", "Read a file", READ_SCHEMA)


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"path": 3},
        {"path": "a", "lines": 0},
        {"path": "a", "extra": True},
        ["not", "an", "object"],
    ],
)
async def test_invalid_arguments_become_an_error_result_without_invocation(args: object) -> None:
    calls: list[JsonObject] = []
    outcome = await _read_tool(calls).run(args, ToolContext(call_id="c", tool_name="read"))  # type: ignore[arg-type]
    assert calls == [] and outcome.is_error
    assert "read" in outcome.text


def test_validation_names_the_failing_path() -> None:
    with pytest.raises(ToolArgumentsError, match="at lines"):
        _read_tool([]).validate({"path": "a", "lines": -1})


def test_a_broken_schema_is_refused_at_definition() -> None:
    async def execute(args: JsonObject, ctx: ToolContext) -> None:
        return None

    with pytest.raises(pico.CommandRejectedError, match="not a valid JSON Schema"):
        Tool("bad", "x", {"type": "no-such-type"}, execute)


async def test_ordinary_exceptions_become_error_results() -> None:
    async def execute(args: JsonObject, ctx: ToolContext) -> None:
        raise FileNotFoundError("a.py")

    tool = Tool("read", "x", {"type": "object"}, execute)
    outcome = await tool.run({}, ToolContext(call_id="c", tool_name="read"))
    assert outcome.is_error and outcome.text == "FileNotFoundError: a.py"


async def test_output_is_bounded_and_progress_is_admitted_in_order() -> None:
    admitted: list[str] = []

    async def sink(text: str) -> None:
        admitted.append(text)

    ctx = ToolContext(call_id="c", tool_name="t", sink=sink, cap=10)
    for chunk in ("12345", "67890", "abcde", "more"):
        await ctx.write(chunk)
    outcome = ctx.outcome()
    assert outcome.text == "1234567890\n[output truncated]"
    assert admitted == ["12345", "67890", "\n[output truncated]"]


async def test_control_intents_are_recorded_for_the_join() -> None:
    async def execute(args: JsonObject, ctx: ToolContext) -> None:
        ctx.add_tools("grep", "edit")
        ctx.add_tools("grep")
        ctx.report_usage(pico.Usage(3, 4))
        ctx.report_usage(pico.Usage(1, 1))
        ctx.set_details({"files": 2})
        ctx.handoff("continue with error recovery")
        ctx.terminate()

    outcome = await Tool("plan", "x", {"type": "object"}, execute).run(
        {}, ToolContext(call_id="c", tool_name="plan")
    )
    assert outcome.add_tools == ("grep", "edit") and outcome.usage == pico.Usage(4, 5)
    assert outcome.details == {"files": 2} and outcome.terminate
    assert outcome.handoff == "continue with error recovery"


def test_registry_presence_is_not_authorization() -> None:
    registry = ToolRegistry([_read_tool([])])
    assert registry.authorize("read", ["read"]).name == "read"
    with pytest.raises(ToolArgumentsError, match="did not offer"):
        registry.authorize("read", ["grep"])
    with pytest.raises(ToolArgumentsError, match="not registered"):
        registry.authorize("grep", ["grep"])
    with pytest.raises(pico.CommandRejectedError, match="twice"):
        ToolRegistry([_read_tool([]), _read_tool([])])
