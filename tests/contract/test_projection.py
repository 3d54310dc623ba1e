"""§2.2: context selects, projection converts — on memory, SQLite and PostgreSQL."""

from __future__ import annotations

import pico
from pico import Command, Message, TextPart, ToolCallPart, ToolResultPart
from tests.backends import Backend


def _assistant_calls(calls: list[tuple[str, str]]) -> pico.JsonValue:
    return {
        "text": "checking",
        "tool_calls": [{"id": i, "name": n, "arguments": {"path": f"{i}.py"}} for i, n in calls],
    }


async def test_tool_results_are_projected_in_call_order(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.append("user", "Inspect the parser")
    await c.append(
        "assistant",
        _assistant_calls([("A", "read"), ("B", "read")]),
        metadata={"tool_calls": ["A", "B"]},
    )
    rb = await c.append(
        "tool", {"content": "file B", "is_error": True}, metadata={"tool_call_id": "B"}
    )
    ra = await c.append("tool", "file A", metadata={"tool_call_id": "A"})
    await c.append("assistant", "Both files read.")
    # The transcript keeps completion order ...
    page = await c.entries()
    assert [e.id for e in page.items][2:4] == [rb, ra]
    # ... the model receives results in call order, in one user message.
    messages = await c.messages()
    assert messages == [
        Message("user", (TextPart("Inspect the parser"),)),
        Message(
            "assistant",
            (
                TextPart("checking"),
                ToolCallPart("A", "read", {"path": "A.py"}),
                ToolCallPart("B", "read", {"path": "B.py"}),
            ),
        ),
        Message(
            "user", (ToolResultPart("A", "file A"), ToolResultPart("B", "file B", is_error=True))
        ),
        Message("assistant", (TextPart("Both files read."),)),
    ]
    await h.close()


async def test_consecutive_user_messages_are_merged_and_notes_project_nothing(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    q1 = await c.append("user", "first")
    await c.append("note", {"ui": "collapsed"})  # selected, but its kind projects nothing
    await c.append("user", "second")
    messages = await c.messages()
    assert messages == [Message("user", (TextPart("first"), TextPart("second")))]
    # Check: a summary projects as user text, ahead of the retained suffix.
    await c.append("assistant", "answer")
    s = await c.compact("Summary: two questions", through=q1)
    assert s > q1
    assert [m.role for m in await c.messages()] == ["user", "assistant"]
    assert (await c.messages())[0].parts[0] == TextPart("Summary: two questions")
    await h.close()


async def test_placements_resolve_their_admission_entries(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.append("user", "start")
    await c.append("assistant", "working on it")

    def queue_then_place(tx: Command) -> tuple[int, int]:
        admission = tx.append_entry(c.id, "user", "queued steering")  # not selected
        placement = tx.append_entry(c.id, "placement", {"input": admission})
        tx.append_context(c.id, [placement])
        return admission, placement

    admission, placement = await h.command(queue_then_place)
    messages = await c.messages()
    assert messages[-1] == Message("user", (TextPart("queued steering"),))
    # The payload was never copied: the placement only refers to the admission entry.
    stored = await h.entry(placement)
    assert stored is not None and stored.content == {"input": admission}
    await h.close()


async def test_projection_reads_history_as_of_a_position(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.append("user", "old question")
    then = h.main_head()
    await c.handoff("fresh start")
    assert await c.messages(as_of=then) == [Message("user", (TextPart("old question"),))]
    assert await c.messages() == [Message("user", (TextPart("fresh start"),))]
    await h.close()
