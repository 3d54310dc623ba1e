"""The JSONL backend's §10.2 fault rows, each forced on real files: a torn final batch, a
malformed complete line, a failed sidecar unlink after a retirement, a reused scope name
with a delayed old cleanup, persistence paused after construction, a committed working
batch without its sidecar line; and seed 000's CheckAppend (duplicate / next / gap)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError

import pico
from pico.infrastructure.jsonl import journal as journal_module
from pico.infrastructure.jsonl.journal import Journal, check_append
from pico.infrastructure.jsonl.store import JsonlStore
from tests.digest import state_digest

SESSION = "s"
WORK = pico.working_scope("task-7/attempt-1")
FRAMES = pico.working_list("app.frames", str, scope=WORK)


def _url(tmp_path: Path) -> str:
    return f"jsonl:///{tmp_path / 'j'}"


def _main(tmp_path: Path) -> Path:
    return tmp_path / "j" / f"{SESSION}.jsonl"


def _sidecars(tmp_path: Path) -> list[Path]:
    scopes = tmp_path / "j" / f"{SESSION}.scopes"
    return sorted(scopes.iterdir()) if scopes.is_dir() else []


def _files(tmp_path: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the store: its bytes and mtime (ns)."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in sorted((tmp_path / "j").rglob("*")):
        if path.is_file():
            out[str(path)] = (path.read_bytes(), path.stat().st_mtime_ns)
    return out


async def _open(tmp_path: Path, **kw: Any) -> pico.Harness:
    return await pico.Harness.open(_url(tmp_path), session=SESSION, **kw)


async def _digest(tmp_path: Path) -> str:
    """What a reader of the files sees (a read-only open: it changes nothing)."""
    h = await _open(tmp_path, read_only=True)
    try:
        return await state_digest(h, lists=[FRAMES], working=[WORK])
    finally:
        await h.close()


def _line_starts(data: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(data):
        if b == ord("\n") and i + 1 < len(data):
            starts.append(i + 1)
    return starts


async def _seeded(tmp_path: Path) -> None:
    """A session with main batches and a live working scope, closed."""
    h = await _open(tmp_path)
    c = await h.root()
    await c.append("user", "first")
    await c.append("assistant", "second")
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "frame 1"))
    await h.close()


# ---------------------------------------------------------------- CheckAppend
@pytest.mark.parametrize(
    ("last", "lo", "hi", "verdict"),
    [
        (5, 3, 5, "duplicate"),  # the last batch again
        (5, 1, 2, "duplicate"),  # an older one
        (5, 6, 6, "next"),
        (5, 6, 9, "next"),
        (0, 1, 2, "next"),  # the first batch of a new journal
        (5, 7, 7, "gap"),
        (5, 8, 10, "gap"),
    ],
)
def test_check_append_classifies_duplicate_next_and_gap(
    last: int, lo: int, hi: int, verdict: str
) -> None:
    assert check_append(last, lo, hi) == verdict


async def test_a_duplicate_batch_is_skipped_and_a_gap_refused(tmp_path: Path) -> None:
    h = await _open(tmp_path)
    c = await h.root()
    await c.append("user", "once")
    storage: Any = h._line.storage
    store: JsonlStore = storage.recorder.store
    last_batch = store.db.session_log(SESSION, -1)
    before = _main(tmp_path).read_bytes()
    log_length = store.db.log_length(SESSION)
    # Check: the last batch again is a duplicate: not re-written, not re-published.
    assert store.write(last_batch, [], []) is False
    assert _main(tmp_path).read_bytes() == before
    assert store.db.log_length(SESSION) == log_length
    # Check: a batch two past the journal's last is a gap: refused, nothing written.
    (event,) = last_batch
    gap = type(event)(
        originator_id=event.originator_id,
        originator_version=store.last + 2,
        topic=event.topic,
        state=event.state,
    )
    with pytest.raises(IntegrityError, match="does not follow"):
        store.write([gap], [], [])
    assert _main(tmp_path).read_bytes() == before
    assert store.last == event.originator_version
    # Check: the handle still works and the next batch follows.
    await c.append("user", "twice")
    await h.close()
    h = await _open(tmp_path, read_only=True)
    contents = [e.content for e in (await (await h.root()).entries(content=True)).items]
    assert contents == ["once", "twice"]
    await h.close()


# ---------------------------------------------------------------- torn final batch
def _cuts(start: int, end: int) -> list[int]:
    """Byte offsets inside the line ``start..end`` (``end`` is its newline): just after
    its first byte, in its middle, and everything but the newline."""
    return sorted({start + 1, (start + end) // 2, end})


async def test_a_torn_final_main_batch_is_dropped_alone_and_the_journal_continues(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    h = await _open(tmp_path)
    await (await h.root()).append("user", "the torn one")
    await h.close()
    full = _main(tmp_path).read_bytes()
    start = _line_starts(full)[-1]
    _main(tmp_path).write_bytes(full[:start])
    before = await _digest(tmp_path)
    for cut in _cuts(start, len(full) - 1):
        _main(tmp_path).write_bytes(full[:cut])
        h = await _open(tmp_path)
        # Check: only that batch is gone; the state is the one before that command.
        assert await state_digest(h, lists=[FRAMES], working=[WORK]) == before
        # Check: the file was made consistent: the tail cut (then the claim appended).
        data = _main(tmp_path).read_bytes()
        assert data.startswith(full[:start]) and data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)
        c = await h.root()
        after = await c.append("user", f"after cut {cut}")
        await h.close()
        h = await _open(tmp_path, read_only=True)
        contents = [e.content for e in (await (await h.root()).entries(content=True)).items]
        assert contents == ["first", "second", f"after cut {cut}"], cut
        assert after in [e.id for e in (await (await h.root()).entries()).items]
        await h.close()


async def test_a_torn_sidecar_line_is_dropped_with_its_uncommitted_batch(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    h = await _open(tmp_path)
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "frame 2 (torn)"))
    await h.close()
    main = _main(tmp_path).read_bytes()
    (sidecar,) = _sidecars(tmp_path)
    side = sidecar.read_bytes()
    # The crash came while the sidecar line was written: its main line never was.
    main_cut = _line_starts(main)[-1]
    side_start = _line_starts(side)[-1]
    _main(tmp_path).write_bytes(main[:main_cut])
    sidecar.write_bytes(side[:side_start])
    before = await _digest(tmp_path)
    for cut in _cuts(side_start, len(side) - 1):
        _main(tmp_path).write_bytes(main[:main_cut])
        sidecar.write_bytes(side[:cut])
        h = await _open(tmp_path)
        assert await state_digest(h, lists=[FRAMES], working=[WORK]) == before
        # Check: the sidecar's torn tail was cut, so the next line starts clean.
        assert sidecar.read_bytes() == side[:side_start]
        await h.command(WORK, lambda tx: tx.append_list(FRAMES, "frame 2"))
        await h.close()
        h = await _open(tmp_path, read_only=True)
        items = [i.value for i in (await h.read_list(FRAMES)).items]
        assert items == ["frame 1", "frame 2"], cut
        await h.close()


async def test_a_complete_sidecar_line_whose_main_line_is_torn_is_not_committed(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    h = await _open(tmp_path)
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "frame 2 (unconfirmed)"))
    await h.close()
    main = _main(tmp_path).read_bytes()
    (sidecar,) = _sidecars(tmp_path)
    side = sidecar.read_bytes()
    start = _line_starts(main)[-1]
    _main(tmp_path).write_bytes(main[:start])
    before = await _digest(tmp_path)
    for cut in _cuts(start, len(main) - 1):
        _main(tmp_path).write_bytes(main[:cut])
        sidecar.write_bytes(side)
        h = await _open(tmp_path)
        assert await state_digest(h, lists=[FRAMES], working=[WORK]) == before
        # Check: the unconfirmed sidecar line was cut with the torn main line.
        assert sidecar.read_bytes() == side[: _line_starts(side)[-1]]
        await h.command(WORK, lambda tx: tx.append_list(FRAMES, "frame 2"))
        await h.close()
        h = await _open(tmp_path, read_only=True)
        assert [i.value for i in (await h.read_list(FRAMES)).items] == ["frame 1", "frame 2"]
        await h.close()


# ---------------------------------------------------------------- malformed lines
def _replace_line(number: int, new: bytes | None) -> Callable[[list[bytes]], list[bytes]]:
    def edit(lines: list[bytes]) -> list[bytes]:
        out = list(lines)
        at = number - 1 if number > 0 else number
        if new is None:
            del out[at]
        else:
            out[at] = new
        return out

    return edit


def _header(version: object) -> bytes:
    return json.dumps({"format": "pico-jsonl", "version": version, "session": SESSION}).encode()


def _uncreated(lines: list[bytes]) -> list[bytes]:
    out = list(lines)
    out[1] = out[1].replace(b"Session.Created", b"Session.Claimed", 1)
    return out


DAMAGE: dict[str, tuple[Callable[[list[bytes]], list[bytes]], int, str]] = {
    "not JSON in the middle": (_replace_line(3, b'{"seq": [3, 4], "scope"'), 3, "is not JSON"),
    "not a batch in the middle": (_replace_line(3, b'{"seq": "x"}'), 3, "is not a batch"),
    "a JSON array in the middle": (_replace_line(3, b"[1, 2]"), 3, "is not a JSON object"),
    "not JSON as the last complete line": (_replace_line(-1, b"garbage"), -1, "is not JSON"),
    "an older format version": (_replace_line(1, _header(0)), 1, "format version 0"),
    "a newer format version": (_replace_line(1, _header(2)), 1, "format version 2"),
    "not a header": (_replace_line(1, b'{"format": "other"}'), 1, "header"),
    "another session's header": (
        _replace_line(
            1, json.dumps({"format": "pico-jsonl", "version": 1, "session": "x"}).encode()
        ),
        1,
        "belongs to session 'x'",
    ),
    "a first batch that does not create the session": (_uncreated, 2, "does not create"),
    "a sequence that jumps": (_replace_line(3, None), 3, "sequences must continue"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_malformed_complete_line_fails_open_and_changes_nothing(
    tmp_path: Path, damage: str
) -> None:
    await _seeded(tmp_path)
    edit, number, why = DAMAGE[damage]
    main = _main(tmp_path)
    lines = edit(main.read_bytes().splitlines())
    if number < 0:  # counted from the end
        number += len(lines) + 1
    data = b"".join(line + b"\n" for line in lines)
    main.write_bytes(data)
    offset = sum(len(line) + 1 for line in lines[: number - 1])
    os.utime(main, ns=(1_000_000_000, 1_000_000_000))  # an mtime a rewrite would change
    files = _files(tmp_path)
    for read_only in (False, True):
        with pytest.raises(pico.StorageCorruptError) as caught:
            await _open(tmp_path, read_only=read_only)
        message = str(caught.value)
        # Check: the error names the file, the line and its byte offset, and why.
        assert str(main) in message
        assert f"line {number} (byte offset {offset})" in message, message
        assert why in message
        # Check: not one byte (nor an mtime) changed, no file appeared or went.
        assert _files(tmp_path) == files


async def test_a_committed_working_batch_without_its_sidecar_line_is_corruption_while_live(
    tmp_path: Path,
) -> None:
    await _seeded(tmp_path)
    (sidecar,) = _sidecars(tmp_path)
    sidecar.unlink()
    files = _files(tmp_path)
    for read_only in (False, True):
        with pytest.raises(pico.StorageCorruptError, match="sidecar record is missing"):
            await _open(tmp_path, read_only=read_only)
        assert _files(tmp_path) == files


async def test_a_sidecar_missing_after_its_retirement_is_fine(tmp_path: Path) -> None:
    await _seeded(tmp_path)
    h = await _open(tmp_path)
    c = await h.root()
    await h.command(lambda tx: tx.retire_working_scope(WORK))
    await c.append("user", "third")
    await h.close()
    assert _sidecars(tmp_path) == []  # the writer unlinked it after the retirement
    before = await _digest(tmp_path)
    h = await _open(tmp_path)
    assert await state_digest(h, lists=[FRAMES], working=[WORK]) == before
    assert (await h.read_list(FRAMES)).items == ()
    await h.close()


async def test_a_deleted_working_file_never_frees_its_ids(tmp_path: Path) -> None:
    """The high-water mark counts every complete batch, main and working: after a scope's
    sidecar is retired and removed, a reopened writer allocates above its records."""
    h = await _open(tmp_path)
    await (await h.root()).append("user", "first")
    for text in ("frame 0", "frame 1", "frame 2"):

        def frame(tx: pico.WorkingCommand, text: str = text) -> None:
            tx.append_list(FRAMES, text)

        await h.command(WORK, frame)
    working_high = h.head()  # the last id a working write took
    await h.command(lambda tx: tx.retire_working_scope(WORK))
    await h.close()
    assert _sidecars(tmp_path) == []
    h = await _open(tmp_path)
    assert h.head() > working_high
    assert await (await h.root()).append("user", "after") > working_high
    await h.close()


# ---------------------------------------------------------------- retirement faults
class _FailingUnlink:
    """``Journal.unlink`` that raises ``OSError`` for its first ``times`` calls (of
    ``only``, when given)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, times: int = 1, only: Path | None = None
    ) -> None:
        self.real = Journal.unlink
        self.times = times
        self.only = only
        self.failed: list[Path] = []
        monkeypatch.setattr(Journal, "unlink", self)

    def __get__(self, journal: Journal, owner: type) -> Callable[[Path], None]:
        def unlink(path: Path) -> None:
            if self.times > 0 and self.only in (None, path):
                self.times -= 1
                self.failed.append(path)
                raise OSError(f"unlink {path}: device busy")
            self.real(journal, path)

        return unlink


async def test_a_failed_unlink_after_a_retirement_leaves_the_old_contents_invisible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    (sidecar,) = _sidecars(tmp_path)
    failing = _FailingUnlink(monkeypatch)
    h = await _open(tmp_path)
    await h.command(lambda tx: tx.retire_working_scope(WORK))
    assert failing.failed == [sidecar] and sidecar.exists()
    # Check: the retirement is authoritative: the contents are gone at once.
    assert (await h.read_list(FRAMES)).items == ()
    before = await state_digest(h, lists=[FRAMES], working=[WORK])
    await h.close()
    # Check: after reopen (reading only: nothing removed) they stay invisible.
    assert await _digest(tmp_path) == before
    assert sidecar.exists()
    # Check: the next writer removes the old file.
    h = await _open(tmp_path)
    assert not sidecar.exists()
    assert await state_digest(h, lists=[FRAMES], working=[WORK]) == before
    await h.close()


async def test_a_reused_scope_name_survives_a_delayed_cleanup_of_the_old_lifetime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    (old,) = _sidecars(tmp_path)
    _FailingUnlink(monkeypatch)
    h = await _open(tmp_path)
    await h.command(lambda tx: tx.retire_working_scope(WORK))
    # The old lifetime's file is still there when the new lifetime writes.
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "new lifetime"))
    assert old.exists()
    (new,) = [p for p in _sidecars(tmp_path) if p != old]
    assert [i.value for i in (await h.read_list(FRAMES)).items] == ["new lifetime"]
    await h.close()
    # Check: reopen shows the new lifetime's records only, reading or writing; the writer
    # removes the old file and keeps the new one.
    for read_only in (True, False):
        h = await _open(tmp_path, read_only=read_only)
        assert [i.value for i in (await h.read_list(FRAMES)).items] == ["new lifetime"]
        await h.close()
    assert _sidecars(tmp_path) == [new]
    h = await _open(tmp_path)
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "and more"))
    await h.close()
    h = await _open(tmp_path, read_only=True)
    assert [i.value for i in (await h.read_list(FRAMES)).items] == ["new lifetime", "and more"]
    await h.close()


# ---------------------------------------------------------------- persistence paused
async def test_persistence_paused_after_construction_shows_readers_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    before = await _digest(tmp_path)
    h = await _open(tmp_path)
    c = await h.root()
    old_head, old_main_head = h.head(), h.main_head()
    old_entries = [e.id for e in (await c.entries()).items]
    seen: dict[str, Any] = {}
    real_append = Journal.append

    def paused(journal: Journal, batch: Any) -> None:
        # The batch is built and checked; nothing is written yet. Readers look now: the
        # writer's own readers (reentrant, same thread) and a reader of the files (a
        # read-only open in another thread).
        seen["head"] = h.head()
        seen["main_head"] = h.main_head()
        digest: list[str] = []
        reader = threading.Thread(target=lambda: digest.append(asyncio.run(_digest(tmp_path))))
        reader.start()
        reader.join(timeout=30)
        seen["files"] = digest
        real_append(journal, batch)

    monkeypatch.setattr(Journal, "append", paused)
    new = await c.append("user", "written after the pause")
    monkeypatch.setattr(Journal, "append", real_append)
    # Check: while paused, every reader saw the old complete state, nothing of the batch.
    assert seen == {"head": old_head, "main_head": old_main_head, "files": [before]}
    # Check: once written, the whole batch is visible.
    assert [e.id for e in (await c.entries()).items] == [*old_entries, new]
    assert h.head() > old_head
    await h.close()


async def test_a_write_that_fails_after_construction_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    before = await _digest(tmp_path)
    h = await _open(tmp_path)
    c = await h.root()
    files = _main(tmp_path).read_bytes()

    def broken(journal: Journal, batch: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Journal, "append", broken)
    with pytest.raises(pico.PersistenceUncertainError):
        await c.append("user", "never written")
    monkeypatch.undo()
    # Check: the handle faults (to it the outcome is unknown); the files and a reader of
    # them hold the old complete state.
    with pytest.raises(pico.HandleFaultedError):
        h.head()
    assert _main(tmp_path).read_bytes() == files
    await h.close()
    assert await _digest(tmp_path) == before


async def test_a_stale_sidecar_line_a_failed_cleanup_left_is_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    h = await _open(tmp_path)
    await h.command(lambda tx: tx.retire_working_scope(WORK))
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "stale"))
    await h.close()
    (stale,) = _sidecars(tmp_path)  # the new lifetime's file; the retired one is gone
    # The crash came between the new lifetime's first sidecar line and its main line...
    main = _main(tmp_path).read_bytes()
    _main(tmp_path).write_bytes(main[: _line_starts(main)[-1]])
    # ... and the cleanup of the file nothing committed fails.
    failing = _FailingUnlink(monkeypatch, only=stale)
    h = await _open(tmp_path)
    assert failing.failed == [stale] and stale.exists()
    # The next batch of the scope reuses the uncommitted ids, so the same file name.
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "fresh"))
    assert _sidecars(tmp_path) == [stale]
    assert [i.value for i in (await h.read_list(FRAMES)).items] == ["fresh"]
    await h.close()
    # Check: the stale line's sequence now belongs to another batch (the claim): never
    # committed, on every reopen.
    for read_only in (True, False):
        h = await _open(tmp_path, read_only=read_only)
        assert [i.value for i in (await h.read_list(FRAMES)).items] == ["fresh"], read_only
        await h.close()


@pytest.mark.parametrize("left", [b"", b'{"format": "pico-js'], ids=["empty", "torn header"])
async def test_a_journal_a_crash_left_without_its_header_is_made_whole(
    tmp_path: Path, left: bytes
) -> None:
    (tmp_path / "j").mkdir()
    _main(tmp_path).write_bytes(left)  # the crash came while the journal was created
    with pytest.raises(pico.UnknownSessionError):
        await _open(tmp_path, read_only=True)
    assert _main(tmp_path).read_bytes() == left
    h = await _open(tmp_path)
    entry = await (await h.root()).append("user", "first")
    await h.close()
    # Check: the header was written before the first batch; every later open reads it.
    lines = _main(tmp_path).read_bytes().splitlines()
    assert json.loads(lines[0]) == {"format": "pico-jsonl", "version": 1, "session": SESSION}
    for read_only in (False, True):
        h = await _open(tmp_path, read_only=read_only)
        assert [e.id for e in (await (await h.root()).entries()).items] == [entry]
        await h.close()


@pytest.mark.parametrize("when", ["before the sidecars are listed", "after they are listed"])
async def test_a_reader_racing_a_retirement_and_its_unlink_reads_a_complete_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    await _seeded(tmp_path)
    writer = await _open(tmp_path)
    read_main, retired = threading.Event(), threading.Event()

    def pause() -> None:  # the reader, once: the main file read, the sidecars not yet
        if not read_main.is_set():
            read_main.set()
            assert retired.wait(30)

    if when == "before the sidecars are listed":
        real_lines = journal_module._lines

        def lines(data: bytes) -> Any:
            out = list(real_lines(data))
            pause()
            return iter(out)

        monkeypatch.setattr(journal_module, "_lines", lines)
    else:
        real_sidecar = Journal._load_sidecar

        def load_sidecar(journal: Journal, *args: Any) -> None:
            pause()
            real_sidecar(journal, *args)

        monkeypatch.setattr(Journal, "_load_sidecar", load_sidecar)

    async def read() -> list[str]:
        h = await _open(tmp_path, read_only=True)
        try:
            return [i.value for i in (await h.read_list(FRAMES)).items]
        finally:
            await h.close()

    reader = asyncio.ensure_future(asyncio.to_thread(lambda: asyncio.run(read())))
    assert await asyncio.to_thread(read_main.wait, 30)
    # The writer retires the scope and unlinks its sidecar while the reader is between
    # the main file and the sidecars.
    (sidecar,) = _sidecars(tmp_path)
    await writer.command(lambda tx: tx.retire_working_scope(WORK))
    assert not sidecar.exists()
    retired.set()
    # Check: the reader is not fooled into corruption: it reads again and sees the
    # retirement (a complete state), not a committed batch whose sidecar vanished.
    assert await reader == []
    await writer.close()


class _Os:
    """The journal's ``os`` with writes cut short to ``chunk`` bytes and fsyncs recorded
    by the path of their descriptor."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.writes = 0
        self.fsynced: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        self.writes += 1
        return os.write(fd, bytes(data[: self.chunk]))

    def fsync(self, fd: int) -> None:
        self.fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)


@pytest.mark.parametrize("durability", ["process", "fsync"])
async def test_short_writes_complete_each_line_and_fsync_mode_syncs_files_and_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    fake = _Os(chunk=7)
    monkeypatch.setattr(journal_module, "os", fake)
    h = await _open(tmp_path, durability=durability)
    synced_create = list(fake.fsynced)
    c = await h.root()
    await c.append("user", "a line far longer than seven bytes")
    fake.fsynced.clear()
    await h.command(WORK, lambda tx: tx.append_list(FRAMES, "the first frame of its file"))
    synced_first_working = list(fake.fsynced)
    fake.fsynced.clear()
    await c.append("user", "another")
    synced_main = list(fake.fsynced)
    await h.close()
    # Check: every line was written whole, however short each write was.
    assert fake.writes > 20
    h = await _open(tmp_path, read_only=True)
    assert [e.content for e in (await (await h.root()).entries(content=True)).items] == [
        "a line far longer than seven bytes",
        "another",
    ]
    assert [i.value for i in (await h.read_list(FRAMES)).items] == ["the first frame of its file"]
    await h.close()
    directory = str(tmp_path / "j")
    (sidecar,) = _sidecars(tmp_path)
    if durability == "process":
        assert synced_create == synced_first_working == synced_main == []
    else:
        # Check: a new sidecar: the store directory (for the new scopes directory), the
        # sidecar, the scopes directory (for the new file), then the main line.
        assert synced_first_working == [
            directory,
            str(sidecar),
            str(sidecar.parent),
            str(_main(tmp_path)),
        ]
        assert synced_main == [str(_main(tmp_path))]
        # Check: a new journal: its file, its directory, the directory's parent (the store
        # directory may be new), then the first batches.
        assert synced_create[:3] == [str(_main(tmp_path)), directory, str(tmp_path)]
        assert set(synced_create[3:]) == {str(_main(tmp_path))}


@pytest.mark.parametrize(
    "write",
    [
        ["bogus", 5, "app.frames", "", "x"],
        ["set", 5, "app.frames", "", None],
        ["append", 5, "app.frames", "", 7],
        ["delete", 5, "app.frames", "", "x"],
        ["append", "5", "app.frames", "", "x"],
    ],
)
async def test_a_sidecar_write_of_the_wrong_shape_is_corruption(
    tmp_path: Path, write: list[Any]
) -> None:
    await _seeded(tmp_path)
    (sidecar,) = _sidecars(tmp_path)
    record = json.loads(sidecar.read_bytes())
    record["writes"] = [write]
    sidecar.write_bytes(json.dumps(record).encode() + b"\n")
    before = _files(tmp_path)
    for read_only in (True, False):
        with pytest.raises(pico.StorageCorruptError, match=r"line 1 \(byte offset 0\)"):
            await _open(tmp_path, read_only=read_only)
    assert _files(tmp_path) == before


async def test_a_claim_the_disk_refuses_is_storage_unavailable_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seeded(tmp_path)
    before = _files(tmp_path)

    def full(self: Journal, batch: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Journal, "append", full)
    with pytest.raises(pico.StorageUnavailableError, match="No space left"):
        await _open(tmp_path)
    monkeypatch.undo()
    assert _files(tmp_path) == before
    h = await _open(tmp_path)  # the lock was released: the next writer gets in
    await h.close()
