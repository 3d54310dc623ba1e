"""The audit export (``pico.audit_records``) on every backend: every event in storage
order, payloads decoded, who and when on each record, each filter, typed errors for bad
filters, and pages read lazily so memory stays flat."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import pico
from pico import AuditRecord, FauxProvider
from pico.application.audit import AuditEntry, audit_records
from tests.backends import Backend


class Counting:
    """An audit source that records every page read (and passes it on)."""

    def __init__(self, source: pico.Harness) -> None:
        self.source = source
        self.reads: list[tuple[int, int]] = []

    def audit(self, *, after: int = 0, limit: int = 1000) -> list[AuditRecord]:
        self.reads.append((after, limit))
        return self.source.audit(after=after, limit=limit)


async def _history(backend: Backend) -> dict[str, Any]:
    """Two owners one after the other, entries with JSON content and metadata, state
    values, a fork and an agent turn; returns what the test needs to know about it."""
    h = await backend.open()
    root = await h.root()
    first = await root.append("user", {"text": "Inspect", "lines": [1, 2]}, metadata={"k": True})
    await root.set_value(
        pico.conversation_value("notes.topic", dict[str, str]), {"subject": "parser"}
    )
    await h.set_value(pico.session_value("team.lead", list[str]), ["ada", "bob"])
    await h.close()
    h = await backend.open(provider=FauxProvider(["The parser recurses."]))
    root = await h.root()
    fork = await root.fork(at_entry=first)
    await fork.append("user", "on the fork")
    _, result = await root.prompt("Why is it slow?")
    assert result is not None and result.status == "done"
    return {"harness": h, "fork": fork.id}


def _all(h: pico.Harness) -> list[AuditRecord]:
    out: list[AuditRecord] = []
    while page := h.audit(after=out[-1].position if out else 0, limit=1000):
        out.extend(page)
    return out


async def test_the_export_has_every_event_in_storage_order(backend: Backend) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        entries = list(audit_records(h, page=7))  # pages smaller than a batch
        stored = _all(h)
        # Check: the same events, in the same order, each once, as the page reads.
        assert [e.position for e in entries] == [r.position for r in stored]
        assert [(e.event, e.aggregate, e.version) for e in entries] == [
            (r.event, r.aggregate, r.version) for r in stored
        ]
        assert len(entries) == h.audit_count()
    finally:
        await h.close()


async def test_json_text_fields_are_exported_as_json_values(backend: Backend) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        entries = list(audit_records(h))
        appended = [e for e in entries if e.event == "Conversation.EntryAppended"]
        assert appended[0].payload["content"] == {"text": "Inspect", "lines": [1, 2]}
        assert appended[0].payload["metadata"] == {"k": True}
        assert any(e.payload["content"] == "on the fork" for e in appended)
        values = {e.event: e.payload["value"] for e in entries if e.event.endswith("ValueSet")}
        assert values["Conversation.ValueSet"] == {"subject": "parser"}
        session_values = [
            e.payload["value"]
            for e in entries
            if e.event == "Session.ValueSet" and e.payload["namespace"] == "team.lead"
        ]
        assert session_values == [["ada", "bob"]]
        created = [e for e in entries if e.event == "Task.Created"]
        assert created and all(isinstance(e.payload["state"], dict) for e in created)
        # Check: the stored body keeps the exact JSON text (what the decoding undoes).
        raw = next(r for r in _all(h) if r.position == appended[0].position)
        assert isinstance(raw.payload["content"], str)
        # Check: the JSON object of a record holds no JSON-in-JSON for these fields.
        assert appended[0].to_json()["payload"] == appended[0].payload
    finally:
        await h.close()


async def test_each_record_says_who_claimed_the_session_and_when(backend: Backend) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        entries = list(audit_records(h))
        claims = [e for e in entries if e.event == "Session.Claimed"]
        assert len(claims) == 2
        first, second = claims
        who = {
            c.position: (c.payload["owner"], c.payload["host"], c.payload["pid"]) for c in claims
        }
        assert who[first.position][0] != who[second.position][0]
        # The second claim's batch starts after the boundary before it (a first
        # configuration fingerprint is saved in its claim's batch, before the claim).
        start = max(
            e.position
            for e in entries
            if e.event in ("Session.Committed", "Session.Claimed") and e.position < second.position
        )
        for e in entries:
            assert e.at is not None and e.at.utcoffset() == timedelta(0)
            # Check: the first owner wrote everything before the second one's claim's
            # batch (the session's creation too: it is in the first claim's own batch).
            claim = second if e.position > start else first
            assert (e.owner, e.host, e.pid) == who[claim.position], e
        assert first.owner != second.owner
    finally:
        await h.close()


async def test_a_record_names_the_task_that_wrote_its_batch_when_the_boundary_records_it(
    backend: Backend,
) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        entries = list(audit_records(h))
        boundaries = {e.position: e for e in entries if e.event == "Session.Committed"}
        for e in entries:
            boundary = next(b for p, b in sorted(boundaries.items()) if p >= e.position)
            expected = boundary.payload.get("task") if e.event != "Session.Claimed" else None
            assert e.task == expected
    finally:
        await h.close()


async def test_each_filter_keeps_exactly_the_events_it_names(backend: Backend) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        everything = list(audit_records(h))
        fork = story["fork"]
        by_conversation = list(audit_records(h, conversation=fork))
        assert by_conversation == [
            e for e in everything if e.payload.get("conversation_id") == fork
        ]
        assert {e.event for e in by_conversation} >= {
            "Conversation.Created",
            "Conversation.EntryAppended",
        }
        kinds = ["Conversation.EntryAppended", "Session.Claimed"]
        assert list(audit_records(h, events=kinds)) == [e for e in everything if e.event in kinds]
        task_id = next(e.payload["task_id"] for e in everything if e.event == "Task.Created")
        assert isinstance(task_id, int)
        by_task = list(audit_records(h, task=task_id))
        assert by_task == [
            e for e in everything if e.aggregate == f"task/{task_id}" or e.task == task_id
        ]
        assert by_task and by_task[0].event == "Task.Created"
        middle = everything[len(everything) // 2]
        assert list(audit_records(h, after=middle.position)) == [
            e for e in everything if e.position > middle.position
        ]
        assert list(audit_records(h, before=middle.position)) == [
            e for e in everything if e.position < middle.position
        ]
        assert middle.at is not None
        assert list(audit_records(h, since=middle.at)) == [
            e for e in everything if e.at is not None and e.at >= middle.at
        ]
        assert list(audit_records(h, until=middle.at)) == [
            e for e in everything if e.at is not None and e.at < middle.at
        ]
        # Check: filters combine (all of them must hold).
        assert list(audit_records(h, events=kinds, after=middle.position)) == [
            e for e in everything if e.event in kinds and e.position > middle.position
        ]
    finally:
        await h.close()


async def test_reading_from_a_position_keeps_who_wrote_each_event(backend: Backend) -> None:
    story = await _history(backend)
    h: pico.Harness = story["harness"]
    try:
        everything = list(audit_records(h))
        for e in everything[1:]:
            tail = list(audit_records(h, after=e.position - 1, page=5))
            assert tail == [x for x in everything if x.position >= e.position]
    finally:
        await h.close()


@pytest.mark.parametrize(
    ("filters", "named"),
    [
        ({"events": ["Conversation.Appended"]}, "Conversation.Appended"),
        ({"events": "Session.Claimed"}, "events"),
        ({"since": datetime(2026, 1, 1)}, "since"),
        ({"until": datetime(2026, 1, 1)}, "until"),
        (
            {"since": datetime(2026, 2, 1, tzinfo=UTC), "until": datetime(2026, 1, 1, tzinfo=UTC)},
            "since",
        ),
        ({"after": -1}, "after"),
        ({"before": -3}, "before"),
        ({"after": 5, "before": 5}, "before"),
        ({"conversation": 0}, "conversation"),
        ({"task": True}, "task"),
        ({"page": 0}, "page"),
    ],
)
async def test_a_bad_filter_is_a_typed_error_before_anything_is_read(
    backend: Backend, filters: dict[str, Any], named: str
) -> None:
    h = await backend.open()
    try:
        source = Counting(h)
        with pytest.raises(pico.InvalidArgumentError, match=named):
            audit_records(source, **filters)
        assert source.reads == []
        # Check: the handle is still usable.
        assert len(list(audit_records(h))) == h.audit_count()
    finally:
        await h.close()


async def test_the_export_reads_pages_lazily_and_in_flat_memory(backend: Backend) -> None:
    h = await backend.open()
    try:
        cid = (await h.root()).id
        for i in range(300):

            def five(tx: pico.Command, i: int = i) -> None:
                ids = [tx.append_entry(cid, "user", f"line {i}.{j} " + "x" * 200) for j in range(5)]
                tx.append_context(cid, ids)

            await h.command(five)
        total = h.audit_count()
        assert total > 2000
        # Check: taking the first records reads one page, not the log.
        source = Counting(h)
        stream = audit_records(source, page=100)
        first = [next(stream) for _ in range(3)]
        assert [e.position for e in first] == [1, 2, 3] or len(first) == 3
        assert len(source.reads) == 1
        # Check: streaming everything holds about one page, far less than the whole list.
        tracemalloc.start()
        try:
            count = sum(1 for _ in audit_records(h, page=100))
            _, streaming = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            kept: list[AuditEntry] = list(audit_records(h, page=100))
            _, holding = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert count == len(kept) == total
        assert streaming * 4 < holding, (streaming, holding)
    finally:
        await h.close()
