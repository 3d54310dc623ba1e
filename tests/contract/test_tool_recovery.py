"""A tool call cut off by the end of its process (§8.4): recovery follows the replay
policy captured before the run — ``safe`` runs it again and the result passes the result
hooks like a first run's; ``never`` writes the interrupted error result without running it.
The cut-off state is what a killed process leaves: the call durably ``running``."""

from __future__ import annotations

import pytest

import pico
from pico import FauxProvider
from tests.backends import Backend


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_a_tool_interrupted_mid_run_recovers_by_its_replay_policy(
    backend: Backend, replay: str
) -> None:
    runs: list[str] = []
    seen: list[str] = []

    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        runs.append("again")
        return "read again"

    async def after(call: pico.ToolCall, outcome: pico.ToolOutcome) -> pico.ToolOutcome:
        seen.append(outcome.text)
        return outcome

    tool = pico.Tool("read", "Read", {"type": "object"}, read, replay=replay)  # type: ignore[arg-type]
    h = await backend.open(
        provider=FauxProvider([]), tools=[tool], hooks=pico.Hooks(after_tool=after)
    )
    c = await h.root()

    def cut_off(tx: pico.Command) -> int:
        call = tx.append_entry(c.id, "assistant", {"text": ""}, metadata={"tool_calls": ["call-1"]})
        tx.append_context(c.id, [call])
        return tx.create_task(
            c.id,
            "tool",
            status="running",
            foreground=True,
            state={
                "call_id": "call-1",
                "name": "read",
                "arguments": {},
                "offered": ["read"],
                "replay": replay,
            },
        )

    task = await h.command(cut_off)
    await h.close()
    h = await backend.open(
        provider=FauxProvider([]), tools=[tool], hooks=pico.Hooks(after_tool=after)
    )
    c = await h.root()
    assert await c.drive() == "idle"
    results = [e.content for e in await c.context_entries() if e.kind == "tool"]
    if replay == "safe":
        assert runs == ["again"]
        assert results == [{"content": "read again", "is_error": False}]
        assert seen == ["read again"]  # the replayed result passed the result hooks
    else:
        assert runs == []  # never run twice
        assert results == [
            {
                "content": "the tool was interrupted; it may or may not have completed",
                "is_error": True,
            }
        ]
    assert (await h.task(task)).status == "done"  # type: ignore[union-attr]
    await h.close()
