"""pico.testing (issue 17): the harness rig users test their own tools with, its
assertions (which must fail, with a diff, on a wrong transcript), and the pytest plugin
loaded the way a user's suite loads it (through pytester, on docs/testing.md's example)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pico
import pico.testing
from pico.infrastructure import memory
from tests.backends import Backend

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    if args.get("path") == "missing":
        raise FileNotFoundError("missing")
    return f"contents of {args['path']}"


READ = pico.Tool("read", "Read a file", {"type": "object"}, read)

TOOL_TURN: list[pico.testing.ScriptItem] = [
    pico.FauxResponse(
        text="Reading both.", tool_calls=[("read", {"path": "a.py"}), ("read", {"path": "missing"})]
    ),
    "a.py is fine; missing is missing.",
]


async def test_a_turn_is_stored_and_read_back_as_rows_on_every_backend(backend: Backend) -> None:
    # The backend's own session: a PostgreSQL database is shared by every test and run.
    async with pico.testing.harness(
        tools=[READ], script=TOOL_TURN, storage=backend.url, session=backend.session
    ) as t:
        result = await t.turn("Check the files")
        assert result.status == "done" and result.entry_id is not None
        # Check the rows against the stored entries themselves.
        entries = await t.entries()
        assert [e.kind for e in entries] == ["user", "assistant", "tool", "tool", "assistant"]
        assert await t.transcript() == [
            ("user", "Check the files"),
            ("assistant", "Reading both."),
            ("tool_call", 'read {"path": "a.py"}'),
            ("tool_call", 'read {"path": "missing"}'),
            ("tool", "contents of a.py"),
            ("tool_error", "FileNotFoundError: missing"),
            ("assistant", "a.py is fine; missing is missing."),
        ]
        results = await t.tool_results()
        assert [(r.name, r.content, r.is_error) for r in results] == [
            ("read", "contents of a.py", False),
            ("read", "FileNotFoundError: missing", True),
        ]
        assert [r.call_id for r in results] == [
            e.metadata["tool_call_id"] for e in entries if e.kind == "tool" and e.metadata
        ]
        assert [task.status for task in await t.tasks(kind="tool")] == ["done", "done"]
        assert len(await t.tasks(kind="generation")) == 2
        assert await t.tasks(live=True) == []
        assert len(t.requests) == 2


async def test_assert_transcript_fails_with_a_diff_on_a_wrong_transcript() -> None:
    async with pico.testing.harness(script=["Hello there."]) as t:
        await t.turn("hi")
        await t.assert_transcript([("user", "hi"), ("assistant", "Hello there.")])
        await t.assert_transcript([["user", "hi"], ["assistant", "Hello there."]])  # lists too
        with pytest.raises(AssertionError) as failed:
            await t.assert_transcript([("user", "hi"), ("assistant", "Hi!")])
    message = str(failed.value)
    assert "--- expected transcript" in message and "+++ actual transcript" in message
    assert "-('assistant', 'Hi!')" in message
    assert "+('assistant', 'Hello there.')" in message
    assert " ('user', 'hi')" in message  # the unchanged row is context


async def test_assert_tool_results_and_assert_tasks_fail_when_they_should() -> None:
    async with pico.testing.harness(tools=[READ], script=TOOL_TURN) as t:
        await t.turn("Check the files")
        await t.assert_tool_results(
            [("read", "contents of a.py", False), ("read", "FileNotFoundError: missing", True)]
        )
        await t.assert_tasks(["done", "done"], kind="tool")
        with pytest.raises(AssertionError, match=r"(?s)tool results differ.*\+\('read', 'Fi"):
            await t.assert_tool_results([("read", "contents of a.py", False)])
        with pytest.raises(AssertionError, match=r"(?s)tool task statuses differ.*-'failed'"):
            await t.assert_tasks(["done", "failed"], kind="tool")


def test_assert_rows_is_silent_when_equal_and_diffs_otherwise() -> None:
    pico.testing.assert_rows([("a", "1")], [("a", "1")])
    with pytest.raises(AssertionError, match=r"(?s)rows differ.*-\('b', '2'\)"):
        pico.testing.assert_rows([("a", "1")], [("a", "1"), ("b", "2")])


async def test_a_turn_with_retries_moves_the_fake_clock_instead_of_sleeping() -> None:
    clock = pico.FakeClock(start=100.0)
    script: list[pico.testing.ScriptItem] = [
        pico.FauxFailure("retryable", "busy", retry_after=30),
        pico.FauxFailure("retryable", "busy"),  # then retry_delay * 2 = 4 s
        "finally",
    ]
    async with pico.testing.harness(script=script, clock=clock, retry_delay=2.0) as t:
        assert t.clock is clock
        result = await t.turn("hi")
        assert result.status == "done"
        assert clock.now() == 134.0
        assert len(t.requests) == 3
        await t.assert_transcript([("user", "hi"), ("assistant", "finally")])


async def test_a_failed_turn_reports_failed_with_its_reason() -> None:
    async with pico.testing.harness(script=[pico.FauxFailure("fatal", "bad key")]) as t:
        result = await t.turn("hi")
        assert result.status == "failed" and result.reason is not None
        assert "bad key" in result.reason
        await t.assert_tasks(["failed"], kind="generation")


async def test_scripting_later_turns_and_harness_options() -> None:
    async with pico.testing.harness(system="You are terse.") as t:
        t.script("one")
        assert (await t.turn("first")).status == "done"
        t.script(lambda request: f"{len(request.messages)} messages")
        assert (await t.turn("second")).status == "done"
        assert t.requests[0].system == "You are terse."
        assert (await t.transcript())[-1] == ("assistant", "3 messages")


async def test_hooks_are_wired_in() -> None:
    async def block(call: pico.ToolCall) -> pico.ToolDecision:
        return pico.ToolDecision("block", "not today")

    hooks = pico.Hooks(before_tool=block)
    script: list[pico.testing.ScriptItem] = [
        pico.FauxResponse(tool_calls=[("read", {"path": "a.py"})]),
        "ok",
    ]
    async with pico.testing.harness(tools=[READ], script=script, hooks=hooks) as t:
        await t.turn("read it")
        await t.assert_tool_results([("read", "not today", True)])


async def test_a_reopen_is_a_restart_that_keeps_the_session(tmp_path: Path) -> None:
    async with pico.testing.harness(
        script=["before", "after"], storage="sqlite", tmp_path=tmp_path
    ) as t:
        await t.turn("one")
        first = t.harness
        await t.reopen()
        assert t.harness is not first
        await t.turn("two")
        await t.assert_transcript(
            [("user", "one"), ("assistant", "before"), ("user", "two"), ("assistant", "after")]
        )
        assert t.url.startswith(f"sqlite:///{tmp_path}")
    assert len(list(tmp_path.glob("pico-*.db"))) == 1


async def test_memory_rigs_are_isolated_and_discarded() -> None:
    async with pico.testing.harness(script=["a"]) as one, pico.testing.harness() as two:
        await one.turn("only in one")
        assert await two.transcript() == []
        name = one.url[len("memory://") :]
        assert name in memory._named
    assert name not in memory._named  # the rig's database went with it


async def test_a_sqlite_rig_without_tmp_path_removes_its_directory() -> None:
    async with pico.testing.harness(storage="sqlite", script=["x"]) as t:
        await t.turn("hi")
        path = Path(t.url[len("sqlite:///") :])
        assert path.exists()
    assert not path.parent.exists()


async def test_a_provider_that_is_not_faux_is_refused() -> None:
    with pytest.raises(pico.InvalidArgumentError, match="FauxProvider"):
        async with pico.testing.harness(provider=object()):  # type: ignore[arg-type]
            pass


def test_importing_pico_testing_does_not_import_pytest() -> None:
    code = "import sys, pico, pico.testing; assert 'pytest' not in sys.modules, 'pytest'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_plugin_leaves_running_async_tests_to_the_users_runner() -> None:
    # A pytest_pyfunc_call here would fight pytest-asyncio's, anyio's and our own.
    assert not hasattr(pico.testing, "pytest_pyfunc_call")
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'\[project\.entry-points\.pytest11\]\npico = "pico\.testing"', text)


def _installed_entry_point() -> bool:
    return any(
        ep.name == "pico" and ep.value == "pico.testing"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def test_the_docs_example_runs_as_a_users_test_module(pytester: pytest.Pytester) -> None:
    """docs/testing.md's pytest example, verbatim, in a fresh project beside a user's
    failing test: the plugin is found through its entry point (or -p, in a checkout
    installed before the entry point was), its fixtures are injected, anyio runs the async
    tests, and a wrong transcript fails with the diff."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/testing.md").read_text(), re.S)
    (example,) = [b for b in blocks if "pico_faux" in b]
    pytester.makepyfile(test_orders=example, test_wrong=WRONG)
    args = ["-p", "no:randomly", "-p", "no:cacheprovider"]
    if not _installed_entry_point():
        args += ["-p", "pico.testing"]
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*-('assistant', 'Hi!')*", "*+('assistant', 'Hello there.')*"])


WRONG = """
import asyncio
import pico.testing


def test_wrong(pico_faux):
    pico_faux.script.append("Hello there.")

    async def scenario():
        async with pico.testing.harness(provider=pico_faux) as t:
            await t.turn("hi")
            await t.assert_transcript([("user", "hi"), ("assistant", "Hi!")])

    asyncio.run(scenario())
"""


async def test_open_rig_and_close_without_a_context_manager() -> None:
    rig = await pico.testing.open_rig(script=["hi"])
    name = rig.url[len("memory://") :]
    assert (await rig.turn("hello")).status == "done"
    await rig.close()
    assert name not in memory._named
    with pytest.raises(pico.ClosedError):
        await rig.transcript()
