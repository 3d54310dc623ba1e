"""Every event recorder pico ships passes the ``eventsourcing`` library's own recorder
contract (``AggregateRecorderTestCase``), subclassed once per backend: a migration tool or
an embedder that drives a pico recorder through the library's API gets the library's
semantics (atomic batches, conflicts on a repeated version, version 0 accepted for a new
stream, ``select_events`` windows).

Snapshot recorders are deliberately not of this contract: they keep only the newest
snapshot of each aggregate (a conversation's snapshot copies its context, so keeping every
one would grow storage with every interval). Their own contract is tested below.
"""

from __future__ import annotations

import gc
import os
import tempfile
import unittest
import uuid
from pathlib import Path
from typing import ClassVar

import pytest
from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent
from eventsourcing.tests.persistence import AggregateRecorderTestCase

from pico.infrastructure.memory import MemoryDatabase, MemoryRecorder
from pico.infrastructure.sql import schema
from pico.infrastructure.sql.store import SqlDatabase, SqlRecorder
from tests.backends import postgres_url


class TestMemoryRecorder(AggregateRecorderTestCase):
    def create_recorder(self) -> AggregateRecorder:
        return MemoryRecorder(MemoryDatabase())


class _SqlRecorderCase(AggregateRecorderTestCase):
    """One database per test class; each test writes fresh originator ids."""

    __test__ = False  # a base: its subclasses name the database

    db: ClassVar[SqlDatabase]
    recorders: ClassVar[list[SqlRecorder]]

    @classmethod
    def tearDownClass(cls) -> None:
        for recorder in cls.recorders:
            recorder.close()
        cls.db.close()
        super().tearDownClass()

    def create_recorder(self) -> AggregateRecorder:
        recorder = SqlRecorder(self.db)
        self.recorders.append(recorder)
        return recorder


class TestSqliteRecorder(_SqlRecorderCase):
    __test__ = True
    _dir: ClassVar[tempfile.TemporaryDirectory[str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._dir = tempfile.TemporaryDirectory()
        cls.db = SqlDatabase(f"sqlite:///{Path(cls._dir.name) / 'recorder.db'}")
        cls.recorders = []

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls._dir.cleanup()


class TestPostgresRecorder(_SqlRecorderCase):
    __test__ = True

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        url = postgres_url()
        if url is None:
            if os.environ.get("PICO_REQUIRE_ALL_BACKENDS"):
                raise AssertionError("PICO_TEST_POSTGRES_URL is unset; every backend is required")
            raise unittest.SkipTest("set PICO_TEST_POSTGRES_URL to run the recorder contract")
        cls.db = SqlDatabase("postgresql+psycopg://" + url.split("://", 1)[1])
        cls.recorders = []


# ---------------------------------------------------------------- snapshot recorders


def _snapshot_recorders(tmp: Path) -> list[tuple[str, AggregateRecorder, object]]:
    memory = MemoryDatabase()
    out: list[tuple[str, AggregateRecorder, object]] = [
        ("memory", MemoryRecorder(memory, snapshots=True), None)
    ]
    sqlite = SqlDatabase(f"sqlite:///{tmp / 'snapshots.db'}")
    out.append(("sqlite", SqlRecorder(sqlite, table=schema.snapshots), sqlite))
    url = postgres_url()
    if url is not None:
        pg = SqlDatabase("postgresql+psycopg://" + url.split("://", 1)[1])
        out.append(("postgresql", SqlRecorder(pg, table=schema.snapshots), pg))
    return out


def test_snapshot_recorders_keep_only_the_newest_snapshot(tmp_path: Path) -> None:
    recorders = _snapshot_recorders(tmp_path)
    if os.environ.get("PICO_REQUIRE_ALL_BACKENDS"):
        assert [name for name, _, _ in recorders] == ["memory", "sqlite", "postgresql"]
    try:
        for name, recorder, _ in recorders:
            oid = uuid.uuid4()
            for version in (200, 400, 600):
                recorder.insert_events(
                    [StoredEvent(oid, version, "snap", f"state{version}".encode())]
                )
            # Check: one snapshot remains, the newest; an older position finds none and
            # the repository replays events from the start instead (correct, slower).
            got = recorder.select_events(oid)
            assert [(e.originator_version, e.state) for e in got] == [(600, b"state600")], name
            assert recorder.select_events(oid, lte=500, desc=True, limit=1) == [], name
            assert recorder.select_events(oid, desc=True, limit=1)[0].originator_version == 600
    finally:
        for _, recorder, db in recorders:
            close = getattr(recorder, "close", None)
            if close is not None:
                close()
            if isinstance(db, SqlDatabase):
                db.close()


@pytest.mark.parametrize("version", [0, 1, 7])
def test_memory_recorder_accepts_any_first_version_and_refuses_a_repeat(version: int) -> None:
    recorder = MemoryRecorder(MemoryDatabase())
    oid = uuid.uuid4()
    recorder.insert_events([StoredEvent(oid, version, "t", b"a")])
    with pytest.raises(IntegrityError) as info:  # the library's, which repositories expect
        recorder.insert_events([StoredEvent(oid, version, "t", b"b")])
    assert type(info.value).__name__ == "IntegrityError"
    assert [e.state for e in recorder.select_events(oid)] == [b"a"]


def test_memory_recorder_refuses_a_repeat_within_one_batch_however_the_id_is_spelled() -> None:
    # The batch check keys streams by value: the same stream as another UUID object, or
    # as text (a migration's events), is still the same stream.
    recorder = MemoryRecorder(MemoryDatabase())
    oid = uuid.uuid4()
    recorder.insert_events([StoredEvent(oid, 1, "t", b"a")])
    for twin in (uuid.UUID(str(oid)), str(oid)):
        with pytest.raises(IntegrityError):
            recorder.insert_events(
                [StoredEvent(oid, 2, "t", b"b"), StoredEvent(twin, 2, "t", b"c")]
            )
    recorder.insert_events([StoredEvent(oid, 2, "t", b"b"), StoredEvent(str(oid), 3, "t", b"c")])
    assert [e.state for e in recorder.select_events(oid)] == [b"a", b"b", b"c"]


def test_memory_windows_match_sqlite_for_every_bound(tmp_path: Path) -> None:
    """The memory recorder finds a window by bisection (a reload after a snapshot copies
    only what it returns): every combination of bounds, direction and limit selects what
    the SQL recorder selects from the same stream."""
    oid = uuid.uuid4()
    stream = [StoredEvent(oid, v, "t", str(v).encode()) for v in range(1, 31)]
    memory = MemoryRecorder(MemoryDatabase())
    memory.insert_events(stream)
    db = SqlDatabase(f"sqlite:///{tmp_path / 'windows.db'}")
    sql = SqlRecorder(db)
    try:
        sql.insert_events(stream)
        bounds = [None, -1, 0, 1, 7, 29, 30, 31]
        for gt in bounds:
            for lte in bounds:
                for desc in (False, True):
                    for limit in (None, 0, 1, 4, 50):
                        got = memory.select_events(oid, gt=gt, lte=lte, desc=desc, limit=limit)
                        want = sql.select_events(oid, gt=gt, lte=lte, desc=desc, limit=limit)
                        assert [e.originator_version for e in got] == [
                            e.originator_version for e in want
                        ], (gt, lte, desc, limit)
    finally:
        sql.close()
        db.close()


def test_the_memory_database_keeps_events_the_garbage_collector_does_not_walk() -> None:
    """A memory session holds every event it ever stored (~38 a turn): kept as tuples of
    ints, strings and bytes, which a collection stops tracking, no full collection walks
    them again; what the recorder and the session log hand out are the stored events."""
    db = MemoryDatabase()
    recorder = MemoryRecorder(db)
    a, b = uuid.uuid4(), uuid.uuid4()
    batch = [
        StoredEvent(a, 1, "x.A", b'{"n":1}'),
        StoredEvent(str(b), 1, "x.B", b"{}"),  # a stream id as text, as a migration gives
        StoredEvent(a, 2, "x.A", b'{"n":2}'),
    ]
    recorder.insert_events(batch, session_id="s")
    gc.collect()
    kept = [*db.log["s"], *(e for stream in db.streams.values() for e in stream)]
    assert len(kept) == 6 and not any(gc.is_tracked(e) for e in kept)
    assert all(e in db.log["s"] for stream in db.streams.values() for e in stream)
    # Check: read back as the stored events, with the stream ids as UUIDs.
    expected = [StoredEvent(a, 1, "x.A", b'{"n":1}'), StoredEvent(b, 1, "x.B", b"{}")]
    expected.append(StoredEvent(a, 2, "x.A", b'{"n":2}'))
    assert db.session_log("s") == expected
    assert db.session_log("s", 1, 2) == expected[1:2] and db.log_length("s") == 3
    assert recorder.select_events(a) == [expected[0], expected[2]]
    assert recorder.select_events(str(b)) == [expected[1]]
    assert recorder.select_session_events("s", after=1, limit=5) == [
        (2, expected[1]),
        (3, expected[2]),
    ]
    assert db.last_version(a) == 2 and db.last_version(uuid.uuid4()) is None
