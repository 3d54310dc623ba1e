"""Migration between every ordered pair of persistent backends (issue 13): a session with
forks, tasks, state values and lists, compactions and an agent turn with a tool is copied
with ``pico.migrate``; the copy is checked here independently of migrate's own proof
(stored rows byte for byte, the same answers to the oracle's queries, a verified chain),
then opened and driven on the target."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.infrastructure.migrate import migrate
from pico.infrastructure.storage import EventSourcedStorage
from tests.backends import Backend, make_backend
from tests.contract.test_oracle import RICH_HISTORY, _apply, _state_view, _task_view, _view
from tests.taskdefs import definitions

PAIRS = [
    ("sqlite", "postgresql"),
    ("postgresql", "sqlite"),
    ("sqlite", "jsonl"),
    ("jsonl", "sqlite"),
    ("postgresql", "jsonl"),
    ("jsonl", "postgresql"),
    ("sqlite", "sqlite"),
]


async def _read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    return f"contents of {args.get('path')}"


READ = pico.Tool("read", "Read a file", {"type": "object"}, _read)


async def build_rich_session(url: str, session: str) -> None:
    """Every kind of history the oracle knows, then an agent turn that calls a tool."""
    provider = pico.FauxProvider(
        [pico.FauxResponse(text="Let me look.", tool_calls=[("read", {"path": "a.py"})]), "Done."]
    )
    h = await pico.Harness.open(
        url, session=session, provider=provider, tools=[READ], definitions=definitions()
    )
    await _apply(h, RICH_HISTORY)
    _, result = await (await h.root()).prompt("Why is it slow?")
    assert result is not None and result.status == "done"
    await h.close()


def backend_in(name: str, tmp_path: Path, where: str, session: str) -> Backend:
    (tmp_path / where).mkdir(exist_ok=True)
    backend = make_backend(name, tmp_path / where)
    backend.session = f"{session}-{uuid.uuid4().hex[:8]}"  # the test server is shared
    return backend


async def stored_rows(url: str, session: str) -> list[tuple[str, int, str, bytes]]:
    """The session's stored events as the backend holds them (not decoded)."""
    h = await pico.Harness.open(url, session=session, read_only=True, definitions=definitions())
    try:
        storage: Any = h._line.storage
        rows = storage.recorder.select_session_events(session, after=0, limit=1_000_000)
    finally:
        await h.close()
    return [(e.originator_id.hex, e.originator_version, e.topic, bytes(e.state)) for _, e in rows]


async def views(url: str, session: str) -> dict[str, Any]:
    """The oracle's queries (transcripts, contexts at every boundary, state, tasks)."""
    h = await pico.Harness.open(url, session=session, read_only=True, definitions=definitions())
    try:
        storage = h._line.storage
        assert isinstance(storage, EventSourcedStorage)
        ids = [s.id for s in (await h.conversations(limit=1000)).items]
        boundaries = sorted(
            {
                r.payload["last"]
                for r in h.audit(limit=100_000)
                if r.event == "Session.Committed" and isinstance(r.payload["last"], int)
            }
        )
        out = _view(storage.queries, ids, boundaries)
        out.update(_state_view(storage.state_queries, ids, boundaries))
        out.update(_task_view(storage.task_queries))
        out["meta"] = (h.head(), h.main_head())
        return out
    finally:
        await h.close()


async def drive(url: str, session: str) -> None:
    """A migrated session opens on the target and takes new work: an append and a faux
    agent turn, and its chain still verifies."""
    h = await pico.Harness.open(
        url,
        session=session,
        provider=pico.FauxProvider(["Still here."]),
        definitions=definitions(),
    )
    try:
        head = h.head()
        c = await h.root()
        await c.append("user", "after the move")
        _, result = await c.prompt("Are you there?")
        assert result is not None and result.status == "done" and result.entry_id is not None
        answer = await h.entry(result.entry_id)
        assert answer is not None and answer.content == {"text": "Still here."}
        assert h.head() > head
        assert (await h.verify()).ok
    finally:
        await h.close()


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
async def test_a_session_migrates_between_persistent_backends_and_proves_equal(
    source: str, target: str, tmp_path: Path
) -> None:
    src = backend_in(source, tmp_path, "source", "mig")
    dst = backend_in(target, tmp_path, "target", "mig")
    dst.session = src.session
    await build_rich_session(src.url, src.session)
    seen: list[tuple[int, int]] = []
    report = await migrate(
        src.url, dst.url, session=src.session, progress=lambda n, total: seen.append((n, total))
    )
    assert report.ok, "\n".join(report.lines())
    # Check: progress was reported batch by batch, up to every event.
    before = await stored_rows(src.url, src.session)
    assert seen[-1] == (len(before), len(before)) and len(seen) == report.batches > 10
    # Check: the target stores exactly the source's rows: ids, versions, topics, bodies.
    assert await stored_rows(dst.url, dst.session) == before
    # Check: both read models answer the oracle's queries the same.
    assert await views(dst.url, dst.session) == await views(src.url, src.session)
    await drive(dst.url, dst.session)


@pytest.mark.parametrize(("source", "target"), [("sqlite", "postgresql"), ("jsonl", "sqlite")])
async def test_a_session_copied_under_another_name_gets_its_own_ids_and_proves_equal(
    source: str, target: str, tmp_path: Path
) -> None:
    src = backend_in(source, tmp_path, "source", "original")
    dst = backend_in(target, tmp_path, "target", "copy")
    await build_rich_session(src.url, src.session)
    report = await migrate(src.url, dst.url, session=src.session, as_name=dst.session)
    assert report.ok, "\n".join(report.lines())
    assert report.target_session == dst.session
    mine, theirs = await stored_rows(dst.url, dst.session), await stored_rows(src.url, src.session)
    # Check: same versions and topics; every stream id derived again for the new name.
    assert [r[1:3] for r in mine] == [r[1:3] for r in theirs]
    assert not {r[0] for r in mine} & {r[0] for r in theirs}
    # Check: bodies are the source's, except the boundaries' re-sealed chain links.
    same = [a[3] == b[3] for a, b in zip(mine, theirs, strict=True)]
    resealed = [a[2] for a, ok in zip(mine, same, strict=True) if not ok]
    assert resealed and all(t.endswith(("Committed", "Claimed")) for t in resealed)
    assert await views(dst.url, dst.session) == await views(src.url, src.session)
    await drive(dst.url, dst.session)
