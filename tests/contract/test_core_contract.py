"""The core storage contract, run unchanged against memory, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

import pico
from pico import Command
from pico.application.line import YIELD_EVERY
from tests.backends import Backend


async def _transcript(conv: pico.ConversationHandle, **kw: object) -> list[int]:
    page = await conv.entries(limit=1000, **kw)  # type: ignore[arg-type]
    return [e.id for e in page.items]


async def _context(conv: pico.ConversationHandle) -> list[int]:
    return list((await conv.snapshot()).context)


# ---------------------------------------------------------------- ids and commits (§3.1)


async def test_ids_are_allocated_per_command_and_a_rejected_command_consumes_none(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    head = h.head()

    def build(tx: Command) -> tuple[int, int]:
        entry = tx.append_entry(c.id, "user", "Inspect the parser")
        tx.append_context(c.id, [entry])
        return entry, tx.last or 0

    entry, last = await h.command(build)
    # Check: the entry's id is the next number; the context edit took the one after it.
    assert entry == head + 1 and last == head + 2
    assert h.head() == last and h.main_head() == last
    got = await h.entry(entry)
    assert got is not None and got.commit_end == last and got.content == "Inspect the parser"

    def failing(tx: Command) -> None:
        tx.append_entry(c.id, "user", "lost")
        raise RuntimeError("builder failed")

    with pytest.raises(RuntimeError):
        await h.command(failing)
    # Check: nothing written, no number consumed.
    assert h.head() == last
    assert await _transcript(c) == [entry]
    nxt = await c.append("user", "next")
    assert nxt == last + 1
    await h.close()


async def test_a_loop_of_commands_lets_the_rest_of_the_process_run_between_them(
    backend: Backend,
) -> None:
    # A save blocks the event loop and an uncontended command never waits: a task that
    # runs commands in a loop must still hand the loop over at least every YIELD_EVERY
    # commands (another session, a lease heartbeat), or it starves the whole process
    # until it stops.
    h = await backend.open()
    c = await h.root()
    ticks: list[int] = []
    done = False

    async def other() -> None:
        while not done:
            ticks.append(len(ticks))
            await asyncio.sleep(0)

    beside = asyncio.ensure_future(other())
    await asyncio.sleep(0)  # it starts
    start = len(ticks)
    seen: list[int] = []  # the other coroutine's ticks when each command returned
    for i in range(30):
        await c.append("user", f"in a loop {i}")
        seen.append(len(ticks))
    done = True
    await beside
    # Check: the other coroutine ran at least once in every YIELD_EVERY commands.
    assert YIELD_EVERY <= 8
    assert len(ticks) - start >= 30 // YIELD_EVERY
    # Check: never more than YIELD_EVERY commands in a row without it running.
    runs = [n for n, (a, b) in enumerate(zip([start, *seen], seen, strict=False)) if b > a]
    gaps = [b - a for a, b in zip([-1, *runs], runs, strict=False)]
    assert runs and max(gaps) <= YIELD_EVERY and 30 - 1 - runs[-1] < YIELD_EVERY
    await h.close()


async def test_a_builder_without_mutations_commits_nothing(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    before = len(h.audit(limit=1000))
    head = h.head()
    result = await h.command(lambda tx: tx.get_conversation(c.id))
    assert result is not None and result.id == c.id
    assert h.head() == head
    assert len(h.audit(limit=1000)) == before
    await h.close()


async def test_every_entry_of_a_multi_entry_commit_carries_the_commit_end(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()

    def build(tx: Command) -> list[int]:
        ids = [tx.append_entry(c.id, "user", f"m{i}") for i in range(3)]
        tx.append_context(c.id, ids)
        return ids

    ids = await h.command(build)
    entries = await h.get_entries(ids)
    assert {e.commit_end for e in entries.values()} == {ids[-1] + 1}
    assert await _context(c) == ids
    await h.close()


async def test_batched_reads_span_more_ids_than_one_statement_holds(backend: Backend) -> None:
    """SQL backends split id lists into IN chunks of 500: every id must come back once,
    duplicates and unknown ids included, across the chunk boundaries."""
    h = await backend.open()

    def build(tx: Command) -> tuple[list[int], list[int]]:
        convs = [tx.create_conversation() for _ in range(3)]
        entries = []
        for i in range(1100):
            e = tx.append_entry(convs[i % 3], "user", f"m{i}")
            tx.append_context(convs[i % 3], [e])
            entries.append(e)
        return convs + [tx.create_conversation() for _ in range(600)], entries

    convs, entries = await h.command(build)
    asked = [*entries[::-1], entries[0], entries[700], 9_999_999]
    got = await h.get_entries(asked)
    assert sorted(got) == entries
    assert all(got[e].content == f"m{i}" for i, e in enumerate(entries))
    snaps = await h.get_conversations([*convs, convs[550], 9_999_999])
    assert sorted(snaps) == convs
    assert [snaps[convs[k]].context for k in range(3)] == [tuple(entries[k::3]) for k in range(3)]
    assert snaps[convs[-1]].context == ()
    await h.close()


async def test_invalid_json_is_rejected_and_nothing_is_written(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    head = h.head()
    for bad in (float("nan"), {1: "x"}, ("tuple",), {"a": {1, 2}}, object()):
        with pytest.raises(pico.InvalidJsonError):
            await c.append("user", bad)  # type: ignore[arg-type]
    with pytest.raises(pico.InvalidJsonError):
        await c.append("user", "ok", metadata={"bad": float("inf")})
    assert h.head() == head
    await h.close()


async def test_returned_content_cannot_mutate_stored_content(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    payload: dict[str, pico.JsonValue] = {"text": "original", "parts": [1, 2]}
    entry_id = await c.append("user", payload)
    payload["text"] = "mutated by caller"
    got = await h.entry(entry_id)
    assert got is not None and isinstance(got.content, dict)
    got.content["parts"] = "mutated by reader"
    again = await h.entry(entry_id)
    assert again is not None and again.content == {"text": "original", "parts": [1, 2]}
    await h.close()


# ---------------------------------------------------------------- context operations (§2.3)


async def _four(c: pico.ConversationHandle) -> list[int]:
    return [await c.append("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(4)]


async def test_compaction_replaces_a_prefix_and_keeps_the_transcript(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    m = await _four(c)
    before = await c.snapshot()
    summary = await c.compact("summary through m1", through=m[1])
    assert await _transcript(c) == [*m, summary]
    assert await _context(c) == [summary, m[2], m[3]]
    after = await c.snapshot()
    assert after.prefix_revision == before.prefix_revision + 1
    # Check: repeated compaction summarizes the previous summary too.
    s2 = await c.compact("summary of everything so far", through=m[2])
    assert await _context(c) == [s2, m[3]]
    # Check: an append after compaction extends the context and keeps the revision.
    m4 = await c.append("user", "m4")
    assert await _context(c) == [s2, m[3], m4]
    assert (await c.snapshot()).prefix_revision == 2
    await h.close()


async def test_reset_discards_the_context_not_the_transcript(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    m = await _four(c)
    handoff = await c.handoff("handoff: continue with the parser")
    assert await _context(c) == [handoff]
    await c.reset_context([])
    assert await _context(c) == []
    assert await _transcript(c) == [*m, handoff]
    await h.close()


async def test_illegal_context_edits_are_rejected_without_writing(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    m = await _four(c)
    other = await h.command(lambda tx: tx.create_conversation())
    foreign = await h.command(lambda tx: tx.append_entry(other, "user", "elsewhere"))
    unselected = await c.append("note", "a note", select=False)
    head = h.head()
    snap = await c.snapshot()

    cases: list[tuple[type[Exception], object]] = [
        (pico.ContextEditError, lambda tx: tx.append_context(c.id, [m[3]])),  # duplicate
        (pico.ContextEditError, lambda tx: tx.append_context(c.id, [m[0]])),  # out of order
        (pico.ContextEditError, lambda tx: tx.append_context(c.id, [foreign])),  # foreign
        (pico.UnknownEntryError, lambda tx: tx.append_context(c.id, [head + 100])),
        (pico.NotInContextError, lambda tx: tx.replace_context_prefix(c.id, unselected, [])),
        (
            pico.StalePrefixError,
            lambda tx: tx.replace_context_prefix(c.id, m[1], [], expected_revision=7),
        ),
        (pico.ContextEditError, lambda tx: tx.reset_context(c.id, [m[0], m[0]])),
        (pico.ContextEditError, lambda tx: tx.replace_context_prefix(c.id, m[1], [m[2]])),
        (pico.UnknownConversationError, lambda tx: tx.append_entry(9999999, "user", "x")),
    ]
    for error, build in cases:
        with pytest.raises(error):
            await h.command(build)  # type: ignore[call-overload]
    assert h.head() == head
    assert await c.snapshot() == snap
    await h.close()


async def test_edits_never_split_a_tool_exchange(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    user = await c.append("user", "read two files")
    call = await c.append("assistant", "calling", metadata={"tool_calls": ["a", "b"]})
    # Check: with calls unanswered, no replacement or reset.
    with pytest.raises(pico.ExchangeSplitError):
        await c.compact("too early", through=user)
    with pytest.raises(pico.ExchangeSplitError):
        await c.reset_context([])
    # Check: an answer to a call that is not selected cannot be selected.
    stray = await c.append("tool", "stray", metadata={"tool_call_id": "zzz"}, select=False)
    with pytest.raises(pico.ExchangeSplitError):
        await c.append_context([stray])
    rb = await c.append("tool", "result b", metadata={"tool_call_id": "b"})
    ra = await c.append("tool", "result a", metadata={"tool_call_id": "a"})
    after = await c.append("user", "thanks")
    # Check: replacing through the call would separate it from its results.
    with pytest.raises(pico.ExchangeSplitError):
        await c.compact("split", through=call)
    with pytest.raises(pico.ExchangeSplitError):
        await c.compact("split", through=rb)
    # Check: through the end of the exchange is fine.
    summary = await c.compact("whole exchange", through=ra)
    assert await _context(c) == [summary, after]
    # Check: a reset may select a whole exchange, never half of one.
    with pytest.raises(pico.ExchangeSplitError):
        await c.reset_context([call, rb])
    await c.reset_context([call, rb, ra])
    assert await _context(c) == [call, rb, ra]
    await h.close()


async def test_a_prepared_replacement_loses_to_a_competing_replacement(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    m = await _four(c)
    prepared_at = (await c.snapshot()).prefix_revision
    # A summary prepared against the old prefix may still land after later appends.
    m4 = await c.append("user", "m4")
    s1 = await c.compact("prepared", through=m[1], expected_revision=prepared_at)
    assert await _context(c) == [s1, m[2], m[3], m4]
    # A second summary prepared against the same revision is now stale.
    with pytest.raises(pico.StalePrefixError):
        await c.compact("stale", through=m[2], expected_revision=prepared_at)
    assert await _context(c) == [s1, m[2], m[3], m4]
    await h.close()


# ---------------------------------------------------------------- history (§7.7) and forks


async def test_context_as_of_replays_edits_not_todays_context(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    m = await _four(c)
    p_after_four = h.main_head()
    s = await c.compact("summary", through=m[1])
    p_after_compact = h.main_head()
    handoff = await c.handoff("handoff")
    assert await c.context_as_of(p_after_four) == tuple(m)
    assert await c.context_as_of(p_after_compact) == (s, m[2], m[3])
    assert await c.context_as_of(h.main_head()) == (handoff,)
    past = await c.snapshot(as_of=p_after_compact)
    assert past.context == (s, m[2], m[3]) and past.prefix_revision == 1
    await h.close()


async def test_a_fork_shares_history_not_future_changes(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    m = await _four(a)
    s = await a.compact("summary", through=m[1])
    await a.handoff("handoff")
    # Fork at the first exchange: the context that existed then, not today's filtered.
    b = await a.fork(at_entry=m[1])
    snap = await b.snapshot()
    assert snap.context == (m[0], m[1])
    assert snap.source is not None and snap.source.conversation_id == a.id
    assert snap.source.as_of == m[1] + 1  # the commit end of the append+select command
    assert snap.inherit_state
    b1 = await b.append("user", "a different question")
    # Check: B's transcript is the shared prefix plus its own entries; no copied rows.
    page = await b.entries()
    assert [e.id for e in page.items] == [m[0], m[1], b1]
    assert [e.conversation_id for e in page.items] == [a.id, a.id, b.id]
    # Check: later edits on either side never affect the other.
    await a.reset_context([])
    assert (await b.snapshot()).context == (m[0], m[1], b1)
    await b.compact("b summary", through=m[1])
    assert await _context(a) == []
    assert s not in [e.id for e in (await b.entries()).items]
    await h.close()


async def test_fork_at_either_entry_of_one_commit_selects_the_same_snapshot(
    backend: Backend,
) -> None:
    h = await backend.open()
    a = await h.root()

    def build(tx: Command) -> tuple[int, int]:
        x = tx.append_entry(a.id, "user", "X")
        y = tx.append_entry(a.id, "user", "Y")
        tx.append_context(a.id, [x, y])
        return x, y

    x, y = await h.command(build)
    end = h.main_head()
    await a.append("user", "later")
    fx = await a.fork(at_entry=x)
    fy = await a.fork(at_entry=y)
    sx, sy = await fx.snapshot(), await fy.snapshot()
    assert sx.context == sy.context == (x, y)
    assert sx.source == sy.source and sx.source is not None and sx.source.as_of == end
    # Check: a position inside a commit rejects; the explicit boundary is the same target.
    with pytest.raises(pico.InvalidPositionError):
        await a.fork(as_of=x)
    with pytest.raises(pico.InvalidPositionError):
        await a.fork(as_of=h.head() + 5)
    fb = await a.fork(as_of=end)
    assert (await fb.snapshot()).context == (x, y)
    await h.close()


async def test_fork_rejects_an_incomplete_tool_exchange(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.append("user", "q")
    call = await a.append("assistant", "calling", metadata={"tool_calls": ["c1"]})
    head = h.head()
    with pytest.raises(pico.InvalidPositionError):
        await a.fork(at_entry=call)
    assert h.head() == head
    await a.append("tool", "r", metadata={"tool_call_id": "c1"})
    fork = await a.fork(as_of=h.main_head())
    assert len((await fork.snapshot()).context) == 3
    await h.close()


async def test_forks_of_forks_cap_inherited_history_at_every_ancestor(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    a1 = await a.append("user", "a1")
    a2 = await a.append("user", "a2")
    b = await a.fork(at_entry=a1)  # B inherits a1 only
    a3 = await a.append("user", "a3")
    b1 = await b.append("user", "b1")
    b2 = await b.append("user", "b2")
    c = await b.fork(at_entry=b1)  # C inherits a1, b1
    c1 = await c.append("user", "c1")
    assert await _transcript(c) == [a1, b1, c1]
    assert (await c.snapshot()).context == (a1, b1, c1)
    # Check: no later ancestor entry leaks (a2, a3, b2).
    assert not {a2, a3, b2} & set(await _transcript(c))
    # Check: forking C at an entry it inherited from A resolves to A's history there.
    d = await c.fork(at_entry=a1)
    assert await _transcript(d) == [a1]
    assert (await d.snapshot()).source == pico.Source(a.id, a1 + 1)
    # Check: descending pages walk the same segments backwards.
    page = await c.entries(order="desc", limit=2)
    assert [e.id for e in page.items] == [c1, b1] and page.next == b1
    rest = await c.entries(order="desc", before=page.next, limit=2)
    assert [e.id for e in rest.items] == [a1] and rest.next is None
    await h.close()


async def test_transcript_pages_filter_before_limit_and_honour_as_of(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    ids = []
    for i in range(12):
        kind = "note" if i % 3 == 0 else "user"
        ids.append(await c.append(kind, f"e{i}", key="k" if i % 4 == 0 else None))
    notes = [i for n, i in enumerate(ids) if n % 3 == 0]
    page = await c.entries(kind="note", limit=2)
    assert [e.id for e in page.items] == notes[:2] and page.next == notes[1]
    page2 = await c.entries(kind="note", after=page.next, limit=10)
    assert [e.id for e in page2.items] == notes[2:] and page2.next is None
    keyed = await c.entries(key="k", limit=10, content=False)
    assert [e.id for e in keyed.items] == [ids[0], ids[4], ids[8]]
    assert all(not e.has_content for e in keyed.items)
    both = await c.entries(kind="note", key="k", limit=10)
    assert [e.id for e in both.items] == [ids[0]]
    cut = ids[5] + 1
    past = await c.entries(as_of=cut, limit=100)
    assert [e.id for e in past.items] == ids[:6] and past.as_of == cut
    window = await c.entries(after=ids[2], before=ids[6], limit=100)
    assert [e.id for e in window.items] == ids[3:6]
    last_page = await c.entries(order="desc", limit=3)
    assert [e.id for e in last_page.items] == ids[::-1][:3]
    with pytest.raises(pico.InvalidArgumentError, match="from 1 to 1000"):
        await c.entries(limit=0)
    await h.close()


async def test_conversation_queries(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    m = await a.append("user", "m")
    forks = [await a.fork(at_entry=m) for _ in range(3)]
    other = await h.command(lambda tx: tx.create_conversation())
    page = await h.conversations(source_conversation_id=a.id, limit=2)
    assert [s.id for s in page.items] == [forks[0].id, forks[1].id]
    assert page.next == forks[1].id
    rest = await h.conversations(source_conversation_id=a.id, after=page.next)
    assert [s.id for s in rest.items] == [forks[2].id]
    everything = await h.conversations(order="desc", limit=100)
    assert [s.id for s in everything.items] == [other, *[f.id for f in forks][::-1], a.id]
    got = await h.get_conversations([a.id, forks[0].id, 424242])
    assert set(got) == {a.id, forks[0].id}
    assert got[forks[0].id].context == (m,)
    # Check: as_of hides conversations created later.
    early = await h.get_conversations([a.id, forks[0].id], as_of=m + 1)
    assert set(early) == {a.id}
    await h.close()


async def test_deleted_conversations_accept_no_new_work(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    m = await a.append("user", "m")
    b = await a.fork(at_entry=m)
    await h.delete_conversation(b.id)
    head = h.head()
    with pytest.raises(pico.ConversationDeletedError):
        await b.append("user", "after delete")
    with pytest.raises(pico.ConversationDeletedError):
        await b.reset_context([])
    with pytest.raises(pico.ConversationDeletedError):
        await h.delete_conversation(b.id)
    with pytest.raises(pico.CommandRejectedError):
        await h.delete_conversation(a.id)  # the root
    assert h.head() == head
    snap = await b.snapshot()
    assert snap.deleted
    assert [e.id for e in (await b.entries()).items] == [m]  # history stays readable
    await h.close()


# ---------------------------------------------------------------- owners, reopen, sessions


async def test_reopen_recovers_state_and_the_high_water_mark(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    m = await _four(a)
    s = await a.compact("summary", through=m[1])
    b = await a.fork(at_entry=m[2])
    head = h.head()
    snaps = await h.get_conversations([a.id, b.id])
    await h.close()
    with pytest.raises(pico.ClosedError):
        await a.append("user", "closed")

    h2 = await backend.open()
    assert h2.head() == head
    assert await h2.get_conversations([a.id, b.id]) == snaps
    a2 = await h2.root()
    assert a2.id == a.id
    nxt = await a2.append("user", "after reopen")
    assert nxt == head + 1
    assert await _context(a2) == [s, m[2], m[3], nxt]
    await h2.close()


async def test_a_second_owner_fences_the_first(backend: Backend) -> None:
    first = await backend.open()
    a = await first.root()
    await a.append("user", "from the first owner")
    head = first.head()
    if backend.exclusive_writer:  # the lock refuses the second writer instead
        with pytest.raises(pico.SessionLockedError):
            await backend.open()
        assert first.head() == head  # nothing was written
        assert await a.append("user", "the owner keeps writing") == head + 1
        written = first.head()
        await first.close()
        second = await backend.open()  # in once the first has gone
        assert second.head() == written
        await second.close()
        return
    second = await backend.open()
    with pytest.raises(pico.StaleWriterError):
        await a.append("user", "stale write")
    # Check: nothing of the stale batch is stored, and the stale handle is faulted.
    assert second.head() == head
    with pytest.raises(pico.HandleFaultedError):
        await a.append("user", "again")
    b = await second.root()
    assert await b.append("user", "from the second owner") == head + 1
    await first.close()
    await second.close()


async def test_sessions_sharing_a_database_are_independent(backend: Backend) -> None:
    one = await backend.open(session=backend.session + "-one")
    two = await backend.open(session=backend.session + "-two")
    c1, c2 = await one.root(), await two.root()
    e1 = await c1.append("user", "in session one")
    e2 = await c2.append("user", "in session two")
    assert e1 == e2  # each session has its own sequence
    assert (await one.entry(e1)).content == "in session one"  # type: ignore[union-attr]
    assert (await two.entry(e2)).content == "in session two"  # type: ignore[union-attr]
    await one.close()
    await two.close()


async def test_read_only_handles_audit_without_claiming(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.append("user", "audited")
    reader = await backend.open(read_only=True)
    records = reader.audit()
    kinds = [r.event for r in records]
    assert kinds[:2] == ["Session.Created", "Session.Claimed"]
    assert "Conversation.EntryAppended" in kinds and kinds[-1] == "Session.Committed"
    assert [r.position for r in records] == sorted(r.position for r in records)
    appended = [r for r in records if r.event == "Conversation.EntryAppended"]
    assert appended[-1].payload["content"] == '"audited"'
    with pytest.raises(pico.ReadOnlyError):
        await (await reader.root()).append("user", "nope")
    # Check: the reader did not fence the writer.
    await a.append("user", "still the owner")
    await reader.close()
    await h.close()
    with pytest.raises(pico.UnknownSessionError):
        await backend.open(session="never-created-" + backend.session, read_only=True)


async def test_audit_count_says_how_many_events_follow_a_position(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    for i in range(3):
        await c.append("user", f"m{i}")
    other = await backend.open(session=backend.session + "-other")
    await (await other.root()).append("user", "not counted")
    records = h.audit(limit=10_000)
    # Check: the count agrees with the log for every cursor, and ignores other sessions.
    assert h.audit_count() == len(records)
    for i, record in enumerate(records):
        assert h.audit_count(after=record.position) == len(records) - i - 1
    with pytest.raises(pico.InvalidArgumentError):
        h.audit_count(after=-1)
    await other.close()
    await h.close()
