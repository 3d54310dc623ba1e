"""``pico check``, ``show`` and ``audit`` on a JSONL journal: read-only opens take no lock
and write nothing (bytes and mtimes of every file unchanged, no lock file made), damage to
the journal is a finding (never an exception), and an event changed in the file behind a
live owner of this process is a difference from the read model that owner answers from."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import pico

ROOT = Path(__file__).resolve().parents[2]


async def _session(directory: Path) -> str:
    """A closed JSONL session with entries, a fork, a compaction, a value and a live
    working scope (a sidecar file)."""
    url = f"jsonl:///{directory}"
    async with await pico.Harness.open(url, session="main") as h:
        c = await h.root()
        q = await c.append("user", "Inspect the parser")
        await c.append("assistant", "The parser has two problems")
        await c.fork(at_entry=q)
        await c.compact("Summary of the first exchange", through=q)
        await h.set_value(pico.session_value("app.name", str), "demo")
        work = pico.working_scope("attempt-1")
        frames = pico.working_list("app.frames", str, scope=work)
        await h.command(work, lambda tx: tx.append_list(frames, "partial output"))
        await c.append("user", "the last words")
    return url


def _files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under the store's directory: its bytes and its mtime (ns)."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pico", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def _edit(directory: Path, edit: Callable[[list[list[Any]]], bool]) -> None:
    """Rewrite the first batch line whose events ``edit`` changes; the line stays JSON."""
    main = directory / "main.jsonl"
    lines = main.read_bytes().split(b"\n")
    for i, raw in enumerate(lines[1:], start=1):
        if raw:
            record = json.loads(raw)
            if edit(record["events"]):
                lines[i] = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
                main.write_bytes(b"\n".join(lines))
                return
    raise AssertionError("no line was edited")


def _entry_appended(text: str, new: str) -> Callable[[list[list[Any]]], bool]:
    def edit(events: list[list[Any]]) -> bool:
        for e in events:
            if e[2].endswith("Conversation.EntryAppended") and text in e[3]:
                e[3] = e[3].replace(text, new)
                return True
        return False

    return edit


@contextmanager
def _held_lock(directory: Path) -> Iterator[None]:
    """The writer's flock, held the way an owner in another process holds it."""
    fd = os.open(directory / "main.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _kinds(report: pico.CheckReport) -> list[str]:
    return [f.kind for f in report.findings]


# --------------------------------------------------------------------- reading only


async def test_check_show_and_audit_take_no_lock_and_leave_every_file_as_it_was(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)
    (directory / "main.lock").unlink()  # the owner is gone; a reader must not make one
    assert any(p.parent.name == "main.scopes" for p in directory.rglob("*.jsonl"))
    before = _files(directory)
    report = await pico.check(url, session="main")
    assert report.ok, [str(f) for f in report.findings]
    assert report.events > 10
    for command in ("check", "show", "audit"):
        done = _cli(command, url)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stderr == ""
    # Check: no file was created, changed or touched.
    assert _files(directory) == before
    shown = _cli("show", url).stdout
    assert "Inspect the parser" in shown and "the last words" in shown
    audited = [json.loads(line) for line in _cli("audit", url).stdout.splitlines()]
    assert len(audited) == report.events
    assert [r["position"] for r in audited] == list(range(1, report.events + 1))
    paged = _cli("audit", url, "--limit", "2")
    assert len(paged.stdout.splitlines()) == 2
    assert f"{report.events - 2} more events remain: continue with --after 2" in paged.stderr
    assert _files(directory) == before


async def test_check_runs_while_another_process_holds_the_writers_lock(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)
    with _held_lock(directory):
        before = _files(directory)
        report = await pico.check(url, session="main")
        done = _cli("check", url)
    assert report.ok and done.returncode == 0, done.stdout + done.stderr
    assert _files(directory) == before


async def test_a_torn_final_line_is_not_a_finding_and_is_left_in_the_file(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)
    main = directory / "main.jsonl"
    whole = main.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    main.write_bytes(whole[: len(whole) - len(last) // 2])  # a crash mid-append
    before = _files(directory)
    report = await pico.check(url, session="main")
    # Check: the cut batch was never committed, so the rest is consistent; only the next
    # writer cuts the tail, never a reader.
    assert report.ok, [str(f) for f in report.findings]
    assert _files(directory) == before


# --------------------------------------------------------------------------- damage


async def test_a_line_that_is_not_json_is_a_storage_finding_naming_line_and_offset(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)
    main = directory / "main.jsonl"
    lines = main.read_bytes().split(b"\n")
    offset = sum(len(line) + 1 for line in lines[:3])
    lines[3] = lines[3][:20] + b"#" + lines[3][21:]
    main.write_bytes(b"\n".join(lines))
    before = _files(directory)
    report = await pico.check(url, session="main")
    assert _kinds(report) == ["storage"]
    assert f"line 4 (byte offset {offset})" in report.findings[0].message
    done = _cli("check", url)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.startswith(f"storage: {main}: line 4 ")
    assert _files(directory) == before


async def test_an_event_that_does_not_decode_is_named_by_its_position(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)

    def garble(events: list[list[Any]]) -> bool:
        for e in events:
            if e[2].endswith("Conversation.EntryAppended") and "the last words" in e[3]:
                e[3] = "{{"
                return True
        return False

    _edit(directory, garble)
    # The ordinary open refuses such a journal; check reports it instead.
    with pytest.raises(pico.StorageCorruptError):
        await pico.Harness.open(url, session="main", read_only=True)
    report = await pico.check(url, session="main")
    audit_lines = [line for line in (directory / "main.jsonl").read_text().splitlines()[1:]]
    position = sum(len(json.loads(line)["events"]) for line in audit_lines[:-1]) + 1
    decode = [f for f in report.findings if f.kind == "decode"]
    assert len(decode) == 1 and decode[0].position == position, [str(f) for f in report.findings]
    assert f"position {position} (conversation/1, version " in decode[0].message
    assert any(f.kind == "read model" and "not compared" in f.message for f in report.findings)


async def test_an_event_dropped_from_its_line_is_a_version_gap(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    url = await _session(directory)

    def drop(events: list[list[Any]]) -> bool:
        for i, e in enumerate(events):
            if e[2].endswith("Conversation.EntryAppended") and "two problems" in e[3]:
                del events[i]
                return True
        return False

    _edit(directory, drop)
    report = await pico.check(url, session="main")
    gaps = [f for f in report.findings if f.kind == "versions"]
    assert len(gaps) == 1, [str(f) for f in report.findings]
    assert gaps[0].message.startswith("conversation/1: version ")
    assert "is missing" in gaps[0].message


async def test_an_event_changed_behind_a_live_owner_differs_from_the_owners_read_model(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "store"
    url = f"jsonl:///{directory}"
    async with await pico.Harness.open(url, session="main") as h:
        c = await h.root()
        await c.append("user", "Inspect the parser")
        await c.append("assistant", "The parser has two problems")
        assert (await pico.check(url, session="main")).ok
        _edit(directory, _entry_appended("Inspect the parser", "Delete the parser"))
        report = await pico.check(url, session="main")
        assert _kinds(report) == ["chain", "read model"], [str(f) for f in report.findings]
        assert "does not match its link" in report.findings[0].message
        message = report.findings[1].message
        assert "index _entries key 2" in message
        assert "Inspect the parser" in message and "Delete the parser" in message
        # Check: the owner still answers from what it committed, and keeps committing.
        await c.append("user", "still the owner")
        first = (await c.entries()).items[0]
        assert first.content == "Inspect the parser"
    # Without a live owner the journal is the only stored form, so no read model differs:
    # the hash chain still finds the edited event, at its commit.
    report = await pico.check(url, session="main")
    assert _kinds(report) == ["chain"], [str(f) for f in report.findings]
    assert "does not match its link" in report.findings[0].message


# --------------------------------------------------------------------------- errors


async def test_a_missing_directory_or_journal_is_an_error_and_creates_nothing(
    tmp_path: Path,
) -> None:
    with pytest.raises(pico.StorageUnavailableError, match="no JSONL directory"):
        await pico.check(f"jsonl:///{tmp_path / 'absent'}", session="main")
    assert not (tmp_path / "absent").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(pico.UnknownSessionError, match="no journal"):
        await pico.check(f"jsonl:///{tmp_path / 'empty'}", session="main")
    assert list((tmp_path / "empty").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(pico.StorageUnavailableError, match="is a file"):
        await pico.check(f"jsonl:///{tmp_path / 'file'}", session="main")
    done = _cli("check", f"jsonl:///{tmp_path / 'empty'}")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr and list((tmp_path / "empty").iterdir()) == []


async def test_a_commit_of_the_live_owner_waits_until_the_check_has_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is read and compared with the owner's read model under the owner's lock: a
    commit started meanwhile lands after the comparison, never between its two reads."""
    import asyncio

    from pico.infrastructure import verify

    directory = tmp_path / "store"
    url = f"jsonl:///{directory}"
    async with await pico.Harness.open(url, session="main") as h:
        c = await h.root()
        await c.append("user", "before the check")
        loop = asyncio.get_running_loop()
        compare = verify._check_log
        started: list[Any] = []

        def commit_meanwhile(*args: Any) -> pico.CheckReport:
            if not started:  # the check's worker thread: the file read, not yet compared
                future = asyncio.run_coroutine_threadsafe(c.append("user", "meanwhile"), loop)
                started.append(future)
                with pytest.raises(TimeoutError):
                    future.result(timeout=0.5)  # held back by the check
            return compare(*args)

        monkeypatch.setattr(verify, "_check_log", commit_meanwhile)
        report = await pico.check(url, session="main")
        assert started, "no commit was attempted during the check"
        assert report.ok, [str(f) for f in report.findings]
        await asyncio.wrap_future(started[0])
        monkeypatch.undo()
        again = await pico.check(url, session="main")
        assert again.ok and again.events > report.events
