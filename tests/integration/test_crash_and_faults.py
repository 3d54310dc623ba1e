"""Crash and fault cases on real files, real servers and real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from eventsourcing.domain import Aggregate

import pico
from pico.domain.ids import conversation_uuid
from pico.infrastructure.container import open_storage
from tests.backends import Backend

ROOT = Path(__file__).resolve().parents[2]


class FaultyStorage:
    """The real storage with a fault injected around ``save`` (before or after the write)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_id = inner.session_id
        self.reads = inner.reads
        self.state = inner.state
        self.tasks = inner.tasks
        self.shares_commits = getattr(inner, "shares_commits", False)
        self.fail: str | None = None

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def load(self, aggregate_id: Any) -> Aggregate | None:
        result: Aggregate | None = self.inner.load(aggregate_id)
        return result

    def save(
        self, aggregates: Sequence[Aggregate], *, working: Sequence[Any] = (), defer: bool = False
    ) -> None:
        if self.fail == "before":
            raise OSError("disk unplugged before the write")
        self.inner.save(aggregates, working=working, defer=defer)
        if self.fail == "after":
            raise OSError("connection lost after the commit")

    def flush(self) -> None:
        if self.fail == "flush":
            raise OSError("disk full at the group commit")
        self.inner.flush()

    def audit(self, **kw: Any) -> Any:
        return self.inner.audit(**kw)

    def count_events(self, **kw: Any) -> Any:
        return self.inner.count_events(**kw)

    def last_position(self) -> Any:
        return self.inner.last_position()

    def replay(self) -> Any:
        return self.inner.replay()

    def verify_chain(self) -> Any:
        return self.inner.verify_chain()

    def chain_anchor(self) -> Any:
        return self.inner.chain_anchor()

    def close(self) -> None:
        self.inner.close()


async def _faulty(backend: Backend) -> tuple[pico.Harness, FaultyStorage]:
    storage = FaultyStorage(
        open_storage(backend.url, session=backend.session, durability=None, read_only=False)
    )
    return await pico.Harness.open(storage), storage


@pytest.mark.parametrize("when", ["before", "after"])
async def test_uncertain_persistence_faults_the_handle_and_reopen_recovers(
    backend: Backend, when: str
) -> None:
    h, storage = await _faulty(backend)
    c = await h.root()
    kept = await c.append("user", "committed")
    head = h.head()
    storage.fail = when
    with pytest.raises(pico.PersistenceUncertainError):
        await c.append("user", "uncertain")
    # Check: the handle refuses further use instead of guessing.
    assert h.faulted is not None
    with pytest.raises(pico.HandleFaultedError):
        await c.append("user", "refused")
    await h.close()

    h2 = await backend.open()
    ids = [e.id for e in (await (await h2.root()).entries()).items]
    if when == "before":
        assert ids == [kept] and h2.head() == head
    else:  # durable, reply lost: the whole batch is there
        assert ids == [kept, head + 1] and h2.head() == head + 2
    nxt = await (await h2.root()).append("user", "after recovery")
    assert nxt == h2.head() - 1 == (head + 1 if when == "before" else head + 3)
    await h2.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import pico

    async def main(url):
        h = await pico.Harness.open(url, session="crash")
        c = await h.root()
        i = 0
        while True:
            entry = await c.append("user", {"n": i, "pad": "x" * 200})
            print(entry, flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_killed_process_loses_no_committed_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    acknowledged = [int(proc.stdout.readline()) for _ in range(300)]
    os.kill(proc.pid, signal.SIGKILL)  # between or inside commits, wherever it is
    proc.wait()
    # What it acknowledged before the kill landed and this test had not read yet (it runs
    # on while the test reads): acknowledged all the same.
    acknowledged += [int(line) for line in proc.stdout.read().split()]
    h = await pico.Harness.open(url, session="crash")
    c = await h.root()
    page = await c.entries(limit=1000)
    stored = [e.id for e in page.items]
    # Check: every acknowledged command is durable; at most the in-flight one more.
    assert stored[: len(acknowledged)] == acknowledged
    assert len(stored) - len(acknowledged) <= 1
    # Check: no half batch: each append-and-select command left its context element.
    assert list((await c.snapshot()).context) == stored
    assert h.head() == stored[-1] + 1
    assert await c.append("user", "resumed") == stored[-1] + 2
    await h.close()


async def test_a_corrupt_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    garbage = b"this is not a database" * 100
    path.write_bytes(garbage)
    with pytest.raises(pico.StorageCorruptError, match="not a SQLite database"):
        await pico.Harness.open(f"sqlite:///{path}")
    assert path.read_bytes() == garbage


async def test_a_corrupt_event_is_reported_not_folded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    h = await pico.Harness.open(url, session="s")
    await (await h.root()).append("user", "fine")
    await h.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE pico_events SET state = x'7b6e6f74206a736f6e' "
            "WHERE topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE '%Session.Claimed%')"
        )
    engine.dispose()
    with pytest.raises(pico.StorageCorruptError, match="could not be reconstructed"):
        await pico.Harness.open(url, session="s")


@pytest.mark.parametrize(("durability", "expected"), [(None, 1), ("process", 1), ("fsync", 2)])
async def test_sqlite_durability_is_an_explicit_option(
    tmp_path: Path, durability: str | None, expected: int
) -> None:
    storage: Any = open_storage(
        f"sqlite:///{tmp_path / 'd.db'}", session="s", durability=durability, read_only=False
    )
    with storage.recorder.db.writer.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == expected
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    storage.close()


def test_settings_reject_an_unknown_storage_url() -> None:
    with pytest.raises(pico.ConfigurationError, match="unsupported storage URL"):
        pico.PicoSettings(storage_url="mysql://nope")


async def test_only_the_newest_snapshot_is_kept_and_reload_uses_it(backend: Backend) -> None:
    from pico.infrastructure.storage import SNAPSHOT_INTERVAL

    h = await backend.open()
    c = await h.root()
    for i in range(SNAPSHOT_INTERVAL + 30):  # two events per append: >2 snapshot intervals
        await c.append("user", f"m{i}")
    storage: Any = h._line.storage
    conv_id = conversation_uuid(backend.session, c.id)
    snaps = list(storage.snapshots.recorder.select_events(conv_id))
    assert len(snaps) == 1 and snaps[0].originator_version >= 2 * SNAPSHOT_INTERVAL
    context = (await c.snapshot()).context
    await h.close()
    # Check: the reloaded aggregate (snapshot + tail events) validates like the original.
    h2 = await backend.open()
    c2 = await h2.root()
    with pytest.raises(pico.ContextEditError):
        await c2.append_context([context[-1]])
    nxt = await c2.append("user", "after reload")
    assert (await c2.snapshot()).context == (*context, nxt)
    await h2.close()
