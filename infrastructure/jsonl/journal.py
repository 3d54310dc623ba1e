"""The JSONL files of one session (seed 003 §7.5, seed 000 "Records and sequence"):
reading them whole, and appending one complete line per batch.

Layout, in the store's directory (``jsonl:///path/dir``), for session ``S`` (percent-encoded
in file names):

    S.jsonl            the main journal: a header line, then one line per committed batch
    S.lock             held with an exclusive ``flock`` by the one writer, for its lifetime
    S.scopes/          one sidecar file per working-scope lifetime: its working writes

A main line is ``{"seq": [lo, hi], "scope": ..., "events": [[id, version, topic, body],
...]}``: ``lo..hi`` are the versions of the Session aggregate's events in the batch (every
batch has at least one, so the journal's sequence is contiguous), ``body`` is the event's
stored JSON text, byte for byte what SQLite and PostgreSQL store. A sidecar line is
``{"seq": hi, "first": f, "last": l, "writes": [[op, seq, namespace, key, value], ...]}``.
A working batch writes its sidecar line first and its main line second: the main line is
the commit record, so a sidecar line no main line confirms was never committed.

Only an unterminated final line is a torn tail; any complete line that does not parse, a
header of another format version, a first batch that does not create the session and a
sequence that does not continue the one before are corruption (``StorageCorruptError``
naming the file, line and byte offset), and nothing is truncated or rewritten then.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote
from uuid import UUID

import pydantic_core
from eventsourcing.persistence import StoredEvent

from pico.domain.errors import StorageCorruptError
from pico.domain.state import StateWrite

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Batch",
    "Cursor",
    "Journal",
    "Loaded",
    "WorkingBatch",
    "check_append",
    "file_name",
    "session_name_fits",
]

FORMAT = "pico-jsonl"
FORMAT_VERSION = 1

#: Topics of the Session aggregate's events (the journal's sequence).
SESSION_TOPIC = "pico.domain.session:Session."

#: The scope of a main batch (any other scope is a working scope's, with a sidecar line).
MAIN_SCOPE = "main"

#: How often a read repeats when a concurrent writer unlinked a sidecar under it.
_RELOADS = 10


#: The longest file name the file systems pico runs on take (Linux's NAME_MAX), in bytes.
NAME_MAX = 255
#: The longest suffix a session's files add to its encoded name (a snapshot rewrite's).
SESSION_SUFFIX = "+snapshots.jsonl.new"


def file_name(name: str) -> str:
    """A session or scope name as one file-name component (percent-encoded)."""
    return quote(name, safe="") or "%00"


def session_name_fits(session_id: str) -> bool:
    """Whether every file of ``session_id`` has a name the file system takes (a non-ASCII
    character is 9 bytes percent-encoded, so 28 CJK characters are too many)."""
    return len(os.fsencode(file_name(session_id) + SESSION_SUFFIX)) <= NAME_MAX


def check_append(last: int, lo: int, hi: int) -> Literal["duplicate", "next", "gap"]:
    """Seed 000's CheckAppend, the one append rule: a batch at or below the last durable
    sequence is a duplicate to skip, the one right after it is next, anything higher is a
    gap. The caller advances ``last`` only after the batch is durably stored, so a torn
    write re-appends the same sequence instead of losing it."""
    if hi <= last:
        return "duplicate"
    if lo == last + 1:
        return "next"
    return "gap"


@dataclass
class Batch:
    """One main line."""

    lo: int
    hi: int
    scope: str
    events: list[StoredEvent]


@dataclass
class WorkingBatch:
    """One sidecar line."""

    seq: int  # the main batch that commits it
    first: int
    last: int
    writes: list[StateWrite]


@dataclass
class Loaded:
    batches: list[Batch] = field(default_factory=list)
    working: dict[int, WorkingBatch] = field(default_factory=dict)  # by main seq
    #: Sidecar files and the byte length of their confirmed prefix (for truncation).
    sidecars: dict[Path, int] = field(default_factory=dict)
    #: Per sidecar: (first seq, scope) of its lifetime.
    lifetimes: dict[Path, tuple[int, str]] = field(default_factory=dict)
    main_length: int = 0  # bytes of complete lines in the main file
    main_lines: int = 0  # how many complete lines those are (the header included)
    last: int = 0  # the last batch's sequence (the one read from before, if none is new)
    torn: bool = False  # the main file ends with an unterminated line


@dataclass
class Cursor:
    """How far a reader has consumed the files: ``load(cursor)`` reads only what follows
    (complete lines only; a torn tail is left for the next read)."""

    main_length: int = 0  # bytes of the main file consumed (complete lines only)
    main_lines: int = 0
    last: int = 0
    #: Per sidecar: the byte length of its prefix already consumed.
    sidecars: dict[Path, int] = field(default_factory=dict)

    def advance(self, loaded: Loaded) -> None:
        """Move past what ``loaded`` read (sidecars that are gone are forgotten)."""
        self.main_length = loaded.main_length
        self.main_lines = loaded.main_lines
        self.last = loaded.last
        self.sidecars = dict(loaded.sidecars)


def _corrupt(path: Path, line: int, offset: int, why: str) -> StorageCorruptError:
    return StorageCorruptError(
        f"{path}: line {line} (byte offset {offset}) {why}; nothing was changed. Restore the "
        "file from a backup, or move the damaged line out of the way yourself (pico never "
        "truncates complete lines)"
    )


def _lines(data: bytes) -> Iterator[tuple[int, int, bytes | None]]:
    """(line number, byte offset, complete line without its newline, or None for an
    unterminated tail)."""
    offset = 0
    number = 0
    while offset < len(data):
        number += 1
        end = data.find(b"\n", offset)
        if end < 0:
            yield number, offset, None
            return
        yield number, offset, data[offset:end]
        offset = end + 1


class Journal:
    """The files of one session. Reading is ``load``; writing is ``append`` (main) and
    ``append_working`` (sidecar), each one complete line written with short writes
    handled, fsynced when ``fsync``."""

    def __init__(self, directory: Path, session_id: str, *, fsync: bool) -> None:
        self.directory = directory
        self.session_id = session_id
        self.fsync = fsync
        base = file_name(session_id)
        self.main = directory / f"{base}.jsonl"
        self.lock = directory / f"{base}.lock"
        self.scopes = directory / f"{base}.scopes"
        self._fds: dict[Path, int] = {}
        self._uuids: dict[str, UUID] = {}
        #: Bytes read from the files so far (a follower reads only what was appended).
        self.bytes_read = 0

    # ------------------------------------------------------------------ reading
    def load(self, cursor: Cursor | None = None) -> Loaded:
        """Parse every complete line of the main file and the sidecars (validated), and
        note a torn tail; change nothing. With a ``cursor``, only what follows it: the
        main file from its byte offset (no header expected there, the sequence continuing
        the cursor's), each sidecar from its consumed length (a new one from its start).

        A reader may run while the writer of another process appends: the main file is
        read first, then the sidecars, so a sidecar line the main file confirms was
        written before it. Only a sidecar the writer unlinked in between (after a
        retirement this read did not see) can be missing; then the main file has grown
        since, and the whole read is repeated."""
        cursor = cursor or Cursor()
        for _ in range(_RELOADS):
            data = self._read_from(self.main, cursor.main_length)
            out = self._load(data, cursor)
            unconfirmed = any(
                b.scope != MAIN_SCOPE and b.hi not in out.working for b in out.batches
            )
            if not unconfirmed or self.main.stat().st_size == cursor.main_length + len(data):
                break
        return out

    def _read_from(self, path: Path, offset: int) -> bytes:
        """The bytes of ``path`` from ``offset`` on. Past the start, the byte before it is
        read too and must end a line: a file rewritten under a reader is corruption, not
        a different history read from the middle of a line."""
        if offset == 0:
            data = path.read_bytes()
            self.bytes_read += len(data)
            return data
        with open(path, "rb") as f:
            f.seek(offset - 1)
            data = f.read()
        self.bytes_read += len(data)
        if data[:1] != b"\n":
            raise StorageCorruptError(
                f"{path}: is {offset - 1 + len(data)} bytes long and no longer ends a line "
                f"at byte offset {offset}, where this reader stopped: the file was truncated "
                "or rewritten under it (pico only appends). Restore the file from a backup, "
                "then open the session again"
            )
        return data[1:]

    def _load(self, data: bytes, cursor: Cursor) -> Loaded:
        out = Loaded(main_length=cursor.main_length, main_lines=cursor.main_lines)
        header_seen = cursor.main_length > 0
        last = cursor.last
        base, lines = cursor.main_length, cursor.main_lines
        for number, offset, raw in _lines(data):
            number, offset = lines + number, base + offset
            if raw is None:
                out.torn = True
                break
            out.main_length = offset + len(raw) + 1
            out.main_lines = number
            record = self._parse(self.main, number, offset, raw)
            if not header_seen:
                self._check_header(number, offset, record)
                header_seen = True
                continue
            batch = self._batch(number, offset, record)
            verdict = check_append(last, batch.lo, batch.hi)
            if verdict != "next" or batch.lo > batch.hi:
                raise _corrupt(
                    self.main,
                    number,
                    offset,
                    f"holds batch {batch.lo}..{batch.hi} after batch ..{last}: sequences must "
                    "continue one after another",
                )
            if last == 0 and not any(e.topic == f"{SESSION_TOPIC}Created" for e in batch.events):
                raise _corrupt(
                    self.main, number, offset, "is the first batch but does not create the session"
                )
            last = batch.hi
            out.batches.append(batch)
        out.last = last
        if self.scopes.is_dir():
            scopes = {batch.hi: batch.scope for batch in out.batches}
            for path in sorted(self.scopes.iterdir()):
                self._load_sidecar(path, last, scopes, out, cursor.sidecars.get(path, 0))
        return out

    def _parse(self, path: Path, number: int, offset: int, raw: bytes) -> dict[str, Any]:
        try:
            record = pydantic_core.from_json(raw)  # the stdlib parser's result, ~2x faster
        except ValueError as exc:
            raise _corrupt(path, number, offset, f"is not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise _corrupt(path, number, offset, "is not a JSON object")
        return record

    def _check_header(self, number: int, offset: int, record: dict[str, Any]) -> None:
        if record.get("format") != FORMAT:
            raise _corrupt(self.main, number, offset, f"is not a {FORMAT} header")
        version = record.get("version")
        if version != FORMAT_VERSION:  # exactly: an older and a newer format are refused
            raise _corrupt(
                self.main,
                number,
                offset,
                f"was written in format version {version!r}; this pico reads version "
                f"{FORMAT_VERSION} only",
            )
        if record.get("session") != self.session_id:
            raise _corrupt(
                self.main,
                number,
                offset,
                f"belongs to session {record.get('session')!r}, not {self.session_id!r}",
            )

    def _batch(self, number: int, offset: int, record: dict[str, Any]) -> Batch:
        try:
            lo, hi = record["seq"]
            scope = record["scope"]
            uuids = self._uuids  # one UUID object per stream, not one per event
            events = []
            for oid, v, t, body in record["events"]:
                if not (isinstance(oid, str) and type(v) is int and isinstance(t, str)):
                    raise ValueError("an event is mistyped")
                uid = uuids.get(oid)
                if uid is None:
                    uid = uuids[oid] = UUID(oid)
                events.append(
                    StoredEvent(
                        originator_id=uid, originator_version=v, topic=t, state=body.encode()
                    )
                )
            if not (type(lo) is int and type(hi) is int and isinstance(scope, str) and events):
                raise ValueError("empty or mistyped")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _corrupt(
                self.main, number, offset, f"is not a batch record ({type(exc).__name__}: {exc})"
            ) from None
        versions = [e.originator_version for e in events if e.topic.startswith(SESSION_TOPIC)]
        if not versions or versions != list(range(lo, hi + 1)):
            raise _corrupt(
                self.main,
                number,
                offset,
                f"says batch {lo}..{hi} but its session events are versions {versions}",
            )
        return Batch(lo, hi, scope, events)

    def _load_sidecar(
        self, path: Path, main_last: int, scopes: dict[int, str], out: Loaded, start: int = 0
    ) -> None:
        confirmed = start
        lifetime: tuple[int, str] | None = None
        try:
            data = self._read_from(path, start)
        except FileNotFoundError:  # unlinked by a writer since the directory was listed
            return
        for number, offset, raw in _lines(data):
            offset += start  # the file's byte offset (line numbers count from ``start``)
            if raw is None:
                break  # a torn sidecar tail: never committed (its main line follows it)
            record = self._parse(path, number, offset, raw)
            try:
                seq = record["seq"]
                first, last = record["first"], record["last"]
                scope = record["scope"]
                writes = [
                    StateWrite(scope=scope, op=op, seq=s, namespace=ns, key=k, value=v)
                    for op, s, ns, k, v in record["writes"]
                ]
                if not all(type(x) is int for x in (seq, first, last)):
                    raise ValueError("mistyped sequence")
                if not isinstance(scope, str):
                    raise ValueError("mistyped scope")
                for w in writes:
                    _check_write(w)
            except (KeyError, TypeError, ValueError) as exc:
                raise _corrupt(
                    path, number, offset, f"is not a working batch ({type(exc).__name__}: {exc})"
                ) from None
            if seq > main_last:
                break  # written, but its main line never was: not committed
            if scopes.get(seq) != scope:
                # A line whose main line was torn and whose file a failed cleanup left
                # behind: its sequence now belongs to another batch. Never committed.
                continue
            if lifetime is None:
                lifetime = (first, scope)
            out.working[seq] = WorkingBatch(seq, first, last, writes)
            confirmed = offset + len(raw) + 1
        out.sidecars[path] = confirmed
        if lifetime is not None:
            out.lifetimes[path] = lifetime

    # ------------------------------------------------------------------ writing
    def create(self) -> None:
        """A new journal: the header line, the directory entry made durable."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write(self.main, self._header(), new=True)
        if self.fsync:  # the store directory may be new too: its own entry
            self.sync_dir(self.directory.parent)

    def _header(self) -> bytes:
        header = {"format": FORMAT, "version": FORMAT_VERSION, "session": self.session_id}
        return json.dumps(header).encode() + b"\n"

    def truncate(self, path: Path, length: int) -> None:
        """Cut an unterminated (or unconfirmed) tail so the next append starts clean."""
        with open(path, "r+b") as f:
            f.truncate(length)
            if self.fsync:
                os.fsync(f.fileno())

    def append(self, batch: Batch) -> None:
        line = {
            "seq": [batch.lo, batch.hi],
            "scope": batch.scope,
            "events": [
                [str(e.originator_id), e.originator_version, e.topic, e.state.decode()]
                for e in batch.events
            ],
        }
        data = _encode(line)
        if self.main not in self._fds and self.main.stat().st_size == 0:
            # A main file with no header: a crash while it was created, or a torn header
            # cut away on open. The header goes first, in the same write.
            data = self._header() + data
        self._write(self.main, data)

    def sidecar(self, scope: str, first: int) -> Path:
        """The file of a working-scope lifetime that starts at ``first``: each lifetime its
        own file, so a delayed cleanup of an old lifetime can never touch a reused name."""
        name = f"{file_name(scope)}.{first}.jsonl"
        if len(os.fsencode(name)) > NAME_MAX:
            # Too long for a file name: its hash instead ("%%" starts no encoded name). The
            # file's lines name their scope; its name only keeps lifetimes apart.
            digest = hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()
            name = f"%%{digest}.{first}.jsonl"
        return self.scopes / name

    def append_working(self, path: Path, batch: WorkingBatch, scope: str) -> None:
        line = {
            "seq": batch.seq,
            "first": batch.first,
            "last": batch.last,
            "scope": scope,
            "writes": [[w.op, w.seq, w.namespace, w.key, w.value] for w in batch.writes],
        }
        new = not path.exists()
        if new and not self.scopes.is_dir():
            self.scopes.mkdir()
            if self.fsync:  # the sidecar directory's own entry, before a file in it
                self.sync_dir(self.directory)
        self._write(path, _encode(line), new=new)

    def unlink(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        path.unlink()

    def _write(self, path: Path, data: bytes, *, new: bool = False) -> None:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:  # a short write continues where it stopped
            written = os.write(fd, view)
            view = view[written:]
        if self.fsync:
            os.fsync(fd)
            if new:  # the new file's directory entry must survive power loss too
                self.sync_dir(path.parent)

    @staticmethod
    def sync_dir(directory: Path) -> None:
        """fsync ``directory``: a file created or renamed in it survives a power loss."""
        dirfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


#: A working write's op and whether it carries a value (text) or none.
_WRITE_OPS = {"set": True, "append": True, "delete": False, "clear": False}


def _check_write(write: StateWrite) -> None:
    """A sidecar write has the shape ``Command`` stores; ValueError otherwise."""
    carries = _WRITE_OPS.get(write.op) if isinstance(write.op, str) else None
    if carries is None:
        raise ValueError(f"unknown op {write.op!r}")
    if type(write.seq) is not int or not isinstance(write.namespace, str):
        raise ValueError("a mistyped sequence or namespace")
    if not isinstance(write.key, str):
        raise ValueError("a mistyped key")
    if carries != isinstance(write.value, str) or (not carries and write.value is not None):
        raise ValueError(f"a {write.op!r} write with value {write.value!r:.40}")
