"""``conversation.rewind`` (§9.1, §6.4), on memory, SQLite and PostgreSQL.

Rewind validates its target first (an invalid one aborts nothing), then requests and drains
the source's foreground cancellation, then forks at the target in one command.
``keep_running=True`` leaves the source's work alone. A tool blocked on an event makes "a
turn is running" a state, not a race.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pico
from pico import FauxProvider, FauxResponse
from tests.backends import Backend
from tests.contract.test_agent import _bounded
from tests.contract.test_shutdown import Blocker
from tests.scheddefs import Scripted

MODEL = pico.conversation_value("agent.model", str, rewind=False)
THINKING = pico.conversation_value("agent.thinking", str, rewind=False)
PLAN = pico.conversation_value("plugin.plan", str)


class Turn:
    """A source conversation with one complete exchange, then a turn whose tool blocks."""

    def __init__(self, h: pico.Harness, c: pico.ConversationHandle, blocker: Blocker) -> None:
        self.h, self.c, self.blocker = h, c, blocker
        self.question = self.answer = self.input_id = 0
        self.drive: asyncio.Future[Any] | None = None

    @classmethod
    async def start(cls, backend: Backend, *, wait_for_signal: bool = True) -> Turn:
        blocker = Blocker(wait_for_signal=wait_for_signal)
        script: list[Any] = [
            "first answer",
            FauxResponse(tool_calls=[("block", {"path": "a"})]),
            "after the tool",
        ]
        h = await backend.open(provider=FauxProvider(script), tools=[blocker.tool()])
        c = await h.root()
        turn = cls(h, c, blocker)
        await c.set_value(MODEL, "small")
        await c.set_value(THINKING, "low")
        await c.set_value(PLAN, "draft")
        turn.question, result = await c.prompt("hello")
        assert result is not None and result.entry_id is not None
        turn.answer = result.entry_id
        await c.set_value(PLAN, "later")  # after the target: a fork does not see it
        turn.input_id = await c.accept("go")
        turn.drive = asyncio.ensure_future(c.drive())
        await _bounded(blocker.started.wait())
        return turn

    async def live(self) -> list[pico.TaskSnapshot]:
        page = await self.h.tasks(conversation_ids=[self.c.id], live=True, limit=100)
        return list(page.items)


async def test_rewind_cancels_and_settles_the_live_turn_before_the_fork_exists(
    backend: Backend,
) -> None:
    turn = await Turn.start(backend)
    h, c = turn.h, turn.c
    running = await turn.live()
    assert {t.kind for t in running} == {"tool", "post_tools"}
    turn.blocker.release.set()  # the tool returns as soon as the signal reaches it
    init = pico.Initialization(inherit=[MODEL, THINKING], set=[(THINKING, "high")])
    fork = await _bounded(c.rewind(at_entry=turn.answer, sticky=init))
    # Check: the source's turn was cancelled and settled before the fork was created.
    assert turn.blocker.signalled.is_set()
    assert await turn.live() == []
    settled = await h.get_tasks([t.id for t in running])
    assert all(t.status == "aborted" or t.role == "terminal" for t in settled.values())
    assert all(t.abort_requested for t in settled.values())
    assert fork.id > max(t.updated_seq for t in settled.values())
    result = await c.result(turn.input_id)
    assert result is not None and result.status == "cancelled"
    # Check: the fork starts from the context at the target, with the sticky overrides.
    snap = await fork.snapshot()
    assert snap.context == (turn.question, turn.answer)
    assert snap.source is not None and snap.source.conversation_id == c.id
    assert await fork.get_value(PLAN) == "draft"
    assert await fork.get_value(MODEL) == "small"
    assert await fork.get_value(THINKING) == "high"
    assert await c.get_value(THINKING) == "low"
    # Check: the fork inherits no live work and the source's drive finished idle.
    assert (await h.tasks(conversation_ids=[fork.id], live=True, limit=10)).items == ()
    assert await _bounded(turn.drive) == "idle"
    await h.close()


async def test_rewind_keep_running_marks_nothing_and_the_source_turn_completes(
    backend: Backend,
) -> None:
    turn = await Turn.start(backend, wait_for_signal=False)
    h, c = turn.h, turn.c
    fork = await _bounded(c.rewind(at_entry=turn.question, keep_running=True))
    live = await turn.live()
    assert {t.kind for t in live} == {"tool", "post_tools"}
    assert not any(t.abort_requested for t in live)
    assert (await fork.snapshot()).context == (turn.question,)
    turn.blocker.release.set()
    assert await _bounded(turn.drive) == "idle"
    result = await c.result(turn.input_id)
    assert result is not None and result.status == "done" and result.entry_id is not None
    answer = await h.entry(result.entry_id)
    assert answer is not None and answer.content == {"text": "after the tool"}
    assert not turn.blocker.signalled.is_set()
    await h.close()


def _invalid_targets(turn: Turn, foreign: int, inside: int, head: int) -> list[dict[str, Any]]:
    return [
        {"at_entry": foreign},  # an entry of another conversation
        {"as_of": inside},  # a position inside a commit
        {"as_of": head + 100},  # a position in the future
        {},  # neither target
        {"at_entry": turn.question, "as_of": head},  # both
        {"at_entry": "3"},  # a malformed id
        {"at_entry": True},
        {"at_entry": turn.question, "keep_running": "yes"},
        {"at_entry": turn.question, "sticky": [PLAN]},  # rewindable: not sticky
    ]


async def test_an_invalid_target_raises_and_aborts_nothing(backend: Backend) -> None:
    turn = await Turn.start(backend)
    h, c = turn.h, turn.c
    other = await c.fork(at_entry=turn.question)
    foreign = await other.append("user", "elsewhere")
    entry = await h.entry(turn.input_id)
    assert entry is not None and entry.commit_end > turn.input_id
    head, before = h.head(), await turn.live()
    for target in _invalid_targets(turn, foreign, turn.input_id, head):
        with pytest.raises(pico.CommandRejectedError) as caught:
            await _bounded(c.rewind(**target))
        assert isinstance(
            caught.value,
            pico.InvalidPositionError | pico.InvalidArgumentError | pico.AddressPolicyError,
        ), target
        # Check: nothing committed, the turn still runs unmarked, the handle still works.
        assert h.head() == head, target
        assert await turn.live() == before, target
    assert not turn.blocker.signalled.is_set()
    assert (await c.result(turn.input_id)).status == "running"  # type: ignore[union-attr]
    turn.blocker.release.set()
    await c.abort()
    assert await _bounded(turn.drive) == "idle"
    await h.close()


def _last_position(h: pico.Harness) -> int:
    """The audit position of this session's last stored event (positions are global on a
    shared PostgreSQL database, so a count is not a position)."""
    return h.audit(after=0, limit=1000)[-1].position


async def test_rewind_of_an_idle_conversation_is_a_fork(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    q = await c.append("user", "q")
    await c.set_value(MODEL, "small")
    await c.append("assistant", "a")
    position = _last_position(h)
    forked = await c.fork(at_entry=q, sticky=[MODEL])
    fork_events = [r.event for r in h.audit(after=position)]
    position, head = _last_position(h), h.head()
    rewound = await c.rewind(at_entry=q, sticky=[MODEL])
    # Check: one command of the same shape, nothing aborted, the same starting point.
    assert [r.event for r in h.audit(after=position)] == fork_events
    assert fork_events.count("Session.Committed") == 1
    assert rewound.id == head + 1
    a, b = await forked.snapshot(), await rewound.snapshot()
    assert (a.context, a.source, a.inherit_state) == (b.context, b.source, b.inherit_state)
    assert await rewound.get_value(MODEL) == "small"
    await h.close()


async def test_the_rewind_drain_runs_only_cleanup_and_starts_no_other_work(
    backend: Backend,
) -> None:
    work = Scripted()
    h = await backend.open(definitions=[work])
    c = await h.root()
    q = await c.append("user", "q")

    def create(tx: pico.Command) -> tuple[int, int]:
        required = tx.create_task(c.id, "work", foreground=True)
        detached = tx.create_task(c.id, "work", foreground=False)
        return required, detached

    required, detached = await h.command(create)
    fork = await _bounded(c.rewind(at_entry=q))
    # Check: the foreground task was aborted through its cleanup before the fork; the
    # ready detached background task was neither marked nor started (a plain drive would).
    assert work.calls == [("abort", required)]
    settled = await h.task(required)
    assert settled is not None and settled.status == "aborted" and fork.id > settled.updated_seq
    waiting = await h.task(detached)
    assert waiting is not None and waiting.status == "pending" and not waiting.abort_requested
    await h.close()


async def test_detached_work_beneath_a_marked_owner_does_not_hold_the_rewind(
    backend: Backend,
) -> None:
    """The rewind drain settles the selected work only: a required owner is marked and
    settles once its SELECTED child work is terminal (§6.5); detached work in its child,
    which no abort selected, keeps running and does not hold the owner or the fork."""
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)  # a waiting task stays waiting
    h = await backend.open(definitions=[work])
    c = await h.root()
    q = await c.append("user", "q")

    def create(tx: pico.Command) -> tuple[int, int]:
        owner = tx.create_task(c.id, "work", status="waiting", foreground=True)
        child = tx.create_owned_conversation(owner)
        return owner, tx.create_task(child, "work", status="waiting", foreground=False)

    owner, detached = await h.command(create)
    fork = await _bounded(c.rewind(at_entry=q))
    settled = await h.task(owner)
    assert settled is not None and settled.status == "aborted"
    still = await h.task(detached)
    assert still is not None and still.live and not still.abort_requested
    assert fork.id > settled.updated_seq  # the fork came after the drain
    await h.close()
