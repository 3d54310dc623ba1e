"""Event versions, upcasting and schema validation before fold (issue 13, "Event versions
and upcasting"). The catalogue below is every stored event type's version and fields: a
shape change that does not bump the version (and add its upcaster) fails the first test.
Old-version bodies written by hand as bytes, the way an old release wrote them, are read
as the current shape on every backend; a body that does not match its type's schema is
``StorageCorruptError`` by position, never folded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

import pico
from pico.domain.conversation import Conversation
from pico.domain.ids import conversation_uuid, session_uuid
from pico.domain.session import Session
from pico.domain.task import Task
from pico.infrastructure.codec import EventSchemaError, event_schema, make_mapper
from pico.infrastructure.container import open_storage
from pico.infrastructure.storage import EventSourcedStorage
from pico.projections.ops import project
from tests.backends import Backend
from tests.bodies import edit_bodies

#: topic -> (class_version, {field: type}); the timestamp (every event's) is left out.
CATALOGUE: dict[str, tuple[int, dict[str, str]]] = {
    "pico.domain.conversation:Conversation.ContextAppended": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "ids": "list[int]",
            "revision": "int",
            "calls": "dict[str, list[str]]",
            "answers": "dict[str, str]",
        },
    ),
    "pico.domain.conversation:Conversation.ContextPrefixReplaced": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "through": "int",
            "removed": "int",
            "replacement": "list[int]",
            "revision": "int",
            "calls": "dict[str, list[str]]",
            "answers": "dict[str, str]",
        },
    ),
    "pico.domain.conversation:Conversation.ContextReset": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "ids": "list[int]",
            "revision": "int",
            "calls": "dict[str, list[str]]",
            "answers": "dict[str, str]",
        },
    ),
    "pico.domain.conversation:Conversation.Created": (
        1,
        {
            "originator_topic": "str",
            "session_id": "str",
            "conversation_id": "int",
            "seq": "int",
            "source_conversation_id": "int | None",
            "source_as_of": "int | None",
            "inherit_state": "bool",
            "owner_task_id": "int | None",
            "context": "list[int]",
            "lineage": "list[list[int]]",
            "calls": "dict[str, list[str]]",
            "answers": "dict[str, str]",
        },
    ),
    "pico.domain.conversation:Conversation.Deleted": (1, {"conversation_id": "int", "seq": "int"}),
    "pico.domain.conversation:Conversation.EntryAppended": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "kind": "str",
            "content": "str",
            "metadata": "str | None",
            "key": "str | None",
            "by_task_id": "int | None",
        },
    ),
    "pico.domain.conversation:Conversation.ListAppended": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "namespace": "str",
            "key": "str",
            "value": "str",
            "rewind": "bool",
        },
    ),
    "pico.domain.conversation:Conversation.ListCleared": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "namespace": "str",
            "key": "str",
            "rewind": "bool",
        },
    ),
    "pico.domain.conversation:Conversation.ValueDeleted": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "namespace": "str",
            "key": "str",
            "rewind": "bool",
        },
    ),
    "pico.domain.conversation:Conversation.ValueSet": (
        1,
        {
            "conversation_id": "int",
            "seq": "int",
            "namespace": "str",
            "key": "str",
            "value": "str",
            "rewind": "bool",
        },
    ),
    "pico.domain.session:Session.ChainStarted": (
        1,
        {"seq": "int", "anchor": "str", "events": "int"},
    ),
    "pico.domain.session:Session.Claimed": (
        2,
        {"owner": "str", "host": "str", "pid": "int", "link": "str"},
    ),
    "pico.domain.session:Session.Committed": (
        2,
        {"first": "int", "last": "int", "scope": "str", "link": "str", "task": "int | None"},
    ),
    "pico.domain.session:Session.ConfigurationChanged": (
        1,
        {
            "seq": "int",
            "fingerprint": "dict[str, str | int | float | None]",
            "changes": "list[dict[str, str | int | float | None]]",
            "acknowledged": "bool",
        },
    ),
    "pico.domain.session:Session.ConfigurationRecorded": (
        1,
        {"fingerprint": "dict[str, str | int | float | None]"},
    ),
    "pico.domain.session:Session.Created": (1, {"originator_topic": "str", "session_id": "str"}),
    "pico.domain.session:Session.ListAppended": (
        1,
        {"seq": "int", "namespace": "str", "key": "str", "value": "str"},
    ),
    "pico.domain.session:Session.ListCleared": (
        1,
        {"seq": "int", "namespace": "str", "key": "str"},
    ),
    "pico.domain.session:Session.RootDesignated": (1, {"conversation_id": "int"}),
    "pico.domain.session:Session.ValueDeleted": (
        1,
        {"seq": "int", "namespace": "str", "key": "str"},
    ),
    "pico.domain.session:Session.ValueSet": (
        1,
        {"seq": "int", "namespace": "str", "key": "str", "value": "str"},
    ),
    "pico.domain.session:Session.WorkingScopeRetired": (1, {"seq": "int", "scope": "str"}),
    "pico.domain.task:Task.AbortRequested": (1, {"task_id": "int", "seq": "int"}),
    "pico.domain.task:Task.Created": (
        1,
        {
            "originator_topic": "str",
            "session_id": "str",
            "task_id": "int",
            "conversation_id": "int",
            "kind": "str",
            "status": "str",
            "role": "str",
            "state": "str",
            "after": "list[int]",
            "foreground": "bool",
            "spawned_by": "int | None",
            "not_before": "float | None",
            "required_permit": "str | None",
        },
    ),
    "pico.domain.task:Task.OwnedConversationLinked": (
        1,
        {"task_id": "int", "seq": "int", "conversation_id": "int"},
    ),
    "pico.domain.task:Task.Patched": (
        1,
        {
            "task_id": "int",
            "seq": "int",
            "status": "str",
            "role": "str",
            "state": "str | None",
            "after": "list[int]",
            "not_before": "float | None",
            "required_permit": "str | None",
        },
    ),
}


def _event_classes() -> dict[str, type]:
    out = {}
    for aggregate in (Session, Conversation, Task):
        for name in dir(aggregate):
            cls = getattr(aggregate, name)
            if (
                isinstance(cls, type)
                and issubclass(cls, Aggregate.Event)
                and cls.__qualname__.startswith(aggregate.__name__ + ".")
                and name != "Event"
            ):
                out[get_topic(cls)] = cls
    return out


def test_every_stored_event_type_has_the_catalogued_version_and_fields() -> None:
    live = {}
    for topic, cls in _event_classes().items():
        schema = event_schema(cls)
        assert schema is not None
        fields = {k: v[0] for k, v in schema.items() if k != "timestamp"}
        live[topic] = (getattr(cls, "class_version", 1), fields)
    # A change of shape needs a new version, an upcaster and a new catalogue line.
    assert live == CATALOGUE


def test_every_version_above_one_has_an_upcaster_from_each_earlier_version() -> None:
    for topic, cls in _event_classes().items():
        for version in range(1, getattr(cls, "class_version", 1)):
            assert callable(getattr(cls, f"upcast_v{version}_v{version + 1}", None)), topic


# --------------------------------------------------------------------------- old bodies
STAMP = '{"_type_":"datetime_iso","_data_":"2026-06-01T10:00:0%d+00:00"}'


def legacy_session(session: str) -> list[list[StoredEvent]]:
    """A session as the release before the hash chain wrote it: ``Session.Claimed`` and
    ``Session.Committed`` at version 1 (no link, no task, no class_version), by hand."""
    s, c = session_uuid(session), conversation_uuid(session, 1)
    sess, conv = "pico.domain.session:Session", "pico.domain.conversation:Conversation"

    def ev(oid: Any, version: int, topic: str, second: int, body: str) -> StoredEvent:
        text = body.replace("@T", STAMP.replace("%d", str(second)))
        text = text.replace("@S", json.dumps(session))
        return StoredEvent(oid, version, topic, text.encode())

    return [
        [
            ev(
                s,
                1,
                f"{sess}.Created",
                0,
                '{"timestamp":@T,"originator_topic":"pico.domain.session:Session","session_id":@S}',
            ),
            ev(
                s,
                2,
                f"{sess}.Claimed",
                1,
                '{"timestamp":@T,"owner":"0f0e0d0c0b0a09080706050403020100",'
                '"host":"old-host","pid":4242}',
            ),
        ],
        [
            ev(
                c,
                1,
                f"{conv}.Created",
                2,
                '{"timestamp":@T,"originator_topic":"pico.domain.conversation:Conversation",'
                '"session_id":@S,"conversation_id":1,"seq":1,"source_conversation_id":null,'
                '"source_as_of":null,"inherit_state":false,"owner_task_id":null,"context":[],'
                '"lineage":[],"calls":{},"answers":{}}',
            ),
            ev(s, 3, f"{sess}.RootDesignated", 2, '{"timestamp":@T,"conversation_id":1}'),
            ev(s, 4, f"{sess}.Committed", 2, '{"timestamp":@T,"first":1,"last":1,"scope":"main"}'),
        ],
        [
            ev(
                c,
                2,
                f"{conv}.EntryAppended",
                3,
                '{"timestamp":@T,"conversation_id":1,"seq":2,"kind":"user",'
                '"content":"\\"Inspect the parser\\"","metadata":null,"key":null,'
                '"by_task_id":null}',
            ),
            ev(
                c,
                3,
                f"{conv}.ContextAppended",
                3,
                '{"timestamp":@T,"conversation_id":1,"seq":3,"ids":[2],"revision":0,'
                '"calls":{},"answers":{}}',
            ),
            ev(s, 5, f"{sess}.Committed", 3, '{"timestamp":@T,"first":2,"last":3,"scope":"main"}'),
        ],
        [
            ev(
                c,
                4,
                f"{conv}.EntryAppended",
                4,
                '{"timestamp":@T,"conversation_id":1,"seq":4,"kind":"assistant",'
                '"content":"\\"It recurses per token\\"","metadata":null,"key":null,'
                '"by_task_id":null}',
            ),
            ev(
                c,
                5,
                f"{conv}.ContextAppended",
                4,
                '{"timestamp":@T,"conversation_id":1,"seq":5,"ids":[4],"revision":0,'
                '"calls":{},"answers":{}}',
            ),
            ev(
                s,
                6,
                f"{sess}.ValueSet",
                4,
                '{"timestamp":@T,"seq":6,"namespace":"plan","key":"step","value":"2"}',
            ),
            ev(s, 7, f"{sess}.Committed", 4, '{"timestamp":@T,"first":4,"last":6,"scope":"main"}'),
        ],
    ]


def write_legacy(backend: Backend) -> None:
    """Store the hand-written batches through the backend's recorder, each with the read
    model rows the current projector derives from it (what the old release stored)."""
    storage = open_storage(backend.url, session=backend.session, durability=None, read_only=False)
    assert isinstance(storage, EventSourcedStorage)
    mapper = make_mapper()
    try:
        for batch in legacy_session(backend.session):
            events = [mapper.to_domain_event(s) for s in batch]
            storage.recorder.insert_events(batch, session_id=backend.session, ops=project(events))
    finally:
        storage.close()


async def _fresh_equivalent(backend: Backend) -> tuple[list[int], list[Any], Any]:
    async with await backend.open(session=f"fresh-{backend.session}") as h:
        c = await h.root()
        await c.append("user", "Inspect the parser")
        await c.append("assistant", "It recurses per token")
        await h.set_value(pico.session_value("plan", int, key="step"), 2)
        return await _state(h)


async def _state(h: pico.Harness) -> tuple[list[int], list[Any], Any]:
    c = await h.root()
    snap = await c.snapshot()
    contents = [(await h.entry(i)) for i in snap.context]
    return (
        list(snap.context),
        [(e.kind, e.content) for e in contents if e is not None],
        await h.get_value(pico.session_value("plan", int, key="step")),
    )


async def test_old_version_bodies_fold_to_the_state_freshly_written_events_give(
    backend: Backend,
) -> None:
    write_legacy(backend)
    async with await backend.open(read_only=True) as h:
        old = await _state(h)
    assert old == await _fresh_equivalent(backend)
    # Check: the upcast boundaries read as unchained, with no writer task.
    async with await backend.open(read_only=True) as h:
        report = await h.verify()
    assert report.ok and report.unchained == 12 and report.head_link == ""


async def test_an_old_session_reopens_and_chains_on_and_an_anchor_covers_its_past(
    backend: Backend,
) -> None:
    write_legacy(backend)
    async with await backend.open() as h:
        await (await h.root()).append("user", "Use a loop")
        report = await h.verify()
        # Check: new batches are chained; the old ones are reported, never "verified".
        assert report.ok and report.unchained == 12 and report.head_link.startswith("sha256:")
        assert "written before the hash chain" in report.summary()
        anchored = await h.start_chain()
        assert anchored == report.events
        report = await h.verify()
        assert report.ok and report.unchained == 0 and report.anchored_at is not None
        # A second anchor has nothing left to cover.
        with pytest.raises(pico.InvalidArgumentError, match="no unchained history"):
            await h.start_chain()
    async with await backend.open() as h:
        # Check: still usable after the refusal, and the anchor survives a reopen.
        await (await h.root()).append("user", "after the anchor")
        assert (await h.verify()).anchored_at == report.anchored_at


async def test_a_fresh_session_has_nothing_to_anchor(backend: Backend) -> None:
    async with await backend.open() as h:
        await (await h.root()).append("user", "hello")
        head = h.head()
        with pytest.raises(pico.InvalidArgumentError, match="no unchained history"):
            await h.start_chain()
        assert h.head() == head  # the refusal consumed no number


async def test_an_anchored_legacy_event_edited_later_breaks_at_the_anchor(tmp_path: Any) -> None:
    import sqlite3

    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'old.db'}")
    write_legacy(backend)
    async with await backend.open() as h:
        await h.start_chain()
        anchor_at = (await h.verify()).anchored_at
    db = sqlite3.connect(tmp_path / "old.db")
    with db:
        edited = edit_bodies(
            db,
            lambda body: body.replace(b"per token", b"per tok3n"),
            where="topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE '%EntryAppended')",
        )
        assert edited > 0
    db.close()
    report = await pico.verify(backend.url, session=backend.session)
    assert not report.ok and report.breaks[0].position == anchor_at
    assert "anchor" in report.breaks[0].message


# --------------------------------------------------------------------------- schemas
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('"first":"1","last":1,"scope":"main"', "first must be int"),
        ('"last":1,"scope":"main"', "missing first"),
        ('"first":1,"last":1,"scope":"main","admin":true', "unknown admin"),
        ('"first":1,"last":1,"scope":null', "scope must be str"),
    ],
)
def test_a_body_that_does_not_match_its_schema_is_refused_by_the_codec(
    body: str, reason: str
) -> None:
    stored = StoredEvent(
        session_uuid("s"),
        4,
        "pico.domain.session:Session.Committed",
        ('{"timestamp":' + STAMP.replace("%d", "0") + "," + body + "}").encode(),
    )
    with pytest.raises(EventSchemaError, match=reason):
        make_mapper().to_domain_event(stored)


def test_a_body_from_a_newer_release_names_its_version() -> None:
    stored = StoredEvent(
        session_uuid("s"),
        4,
        "pico.domain.session:Session.Committed",
        (
            '{"timestamp":' + STAMP.replace("%d", "0") + ',"first":1,"last":1,"scope":"main",'
            '"link":"","task":null,"class_version":3}'
        ).encode(),
    )
    with pytest.raises(EventSchemaError, match=r"class_version 3.*upgrade pico"):
        make_mapper().to_domain_event(stored)


async def test_a_stored_event_off_its_schema_is_storage_corrupt_by_position(
    backend: Backend,
) -> None:
    batches = legacy_session(backend.session)
    bad = batches[2][0]
    # An entry whose id is a string: valid JSON, wrong type.
    batches[2][0] = StoredEvent(
        bad.originator_id,
        bad.originator_version,
        bad.topic,
        bad.state.replace(b'"seq":2', b'"seq":"2"'),
    )
    storage = open_storage(backend.url, session=backend.session, durability=None, read_only=False)
    assert isinstance(storage, EventSourcedStorage)
    mapper = make_mapper()
    try:
        for i, batch in enumerate(batches):
            good = legacy_session(backend.session)[i]
            ops = project([mapper.to_domain_event(s) for s in good])
            storage.recorder.insert_events(batch, session_id=backend.session, ops=ops)
    finally:
        storage.close()
    # Check: loading, replaying and verifying each refuse it, naming where it is.
    with pytest.raises(pico.StorageCorruptError, match="seq must be int"):
        async with await backend.open() as h:
            await (await h.root()).snapshot()
    if backend.name == "jsonl":  # its open decodes the journal: the open refuses
        with pytest.raises(pico.StorageCorruptError, match=r"does not decode.*seq must be int"):
            await pico.verify(backend.url, session=backend.session)
        return
    # A verify reports it as a break at its position and reads on (exit code 1, not 2).
    report = await pico.verify(backend.url, session=backend.session)
    assert not report.ok
    (found,) = [b for b in report.breaks if "seq must be int" in b.message]
    assert found.position == found.last and f"event {found.position} " in found.message


def test_a_newer_version_is_refused_on_the_library_decoding_path_too() -> None:
    # Two transcoded values: the fast path hands the body to the library's decoder.
    stamp = STAMP.replace("%d", "0")
    stored = StoredEvent(
        session_uuid("s"),
        4,
        "pico.domain.session:Session.Committed",
        (
            '{"timestamp":' + stamp + ',"first":1,"last":1,"scope":"main","link":"",'
            '"task":null,"class_version":3,"later":' + stamp + "}"
        ).encode(),
    )
    with pytest.raises(EventSchemaError, match=r"class_version 3.*upgrade pico"):
        make_mapper().to_domain_event(stored)


async def test_old_version_bodies_replay_to_the_read_model_they_were_stored_with(
    backend: Backend,
) -> None:
    write_legacy(backend)
    report = await pico.replay(backend.url, session=backend.session)
    # Check: the upcast v1 boundaries replay to the rows stored with them, and the
    # events read equal the hand-written ones.
    assert report.equal, report.lines()
    assert report.events == sum(len(b) for b in legacy_session(backend.session))
    assert not report.warnings
