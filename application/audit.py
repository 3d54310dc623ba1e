"""The audit export (issue 13, "Audit export an auditor can read"): every stored event of a
session as a typed record an auditor reads: what (the event and its payload, JSON text
fields decoded), when (UTC) and who (the claim current when its batch was written, and the
task whose execution wrote it).

``audit_records`` streams in storage order, a page at a time through the storage port's
``audit`` page read, and buffers at most one batch (who wrote a batch is known at its
boundary, the batch's last event), so memory stays flat for any log length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from eventsourcing.domain import Aggregate

from pico.application.ports import AuditRecord
from pico.domain.conversation import Conversation
from pico.domain.errors import InvalidArgumentError, StorageCorruptError
from pico.domain.ids import check_id, check_limit, check_optional_position, check_position
from pico.domain.json import JsonObject, JsonValue, loads
from pico.domain.session import BOUNDARY_NAMES, Session
from pico.domain.task import Task

__all__ = [
    "AUDIT_COLUMNS",
    "AUDIT_PAGE",
    "EVENT_TYPES",
    "AuditEntry",
    "AuditSource",
    "audit_records",
]

#: Events read per page while streaming.
AUDIT_PAGE = 1000

#: The fields of an exported record, in order (the CSV header; ``payload`` is JSON there).
AUDIT_COLUMNS = (
    "position",
    "at",
    "aggregate",
    "version",
    "event",
    "owner",
    "host",
    "pid",
    "task",
    "payload",
)

#: Every stored event type, by the name the export gives it (``Conversation.EntryAppended``).
EVENT_TYPES: frozenset[str] = frozenset(
    f"{aggregate.__name__}.{name}"
    for aggregate in (Session, Conversation, Task)
    for name, value in vars(aggregate).items()
    if name != "Event" and isinstance(value, type) and issubclass(value, Aggregate.Event)
)

#: Payload fields stored as the exact JSON text the strict-JSON gate produced at write time
#: (byte-identical on every backend); the export shows them as JSON values.
JSON_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "Conversation.EntryAppended": ("content", "metadata"),
    "Conversation.ValueSet": ("value",),
    "Conversation.ListAppended": ("value",),
    "Session.ValueSet": ("value",),
    "Session.ListAppended": ("value",),
    "Task.Created": ("state",),
    "Task.Patched": ("state",),
}

#: A saved batch ends with its boundary: a command's Committed, or an opening's Claimed.


class AuditSource(Protocol):
    """What the export reads: a ``Harness`` (its ``audit``) or a ``Storage``."""

    def audit(self, *, after: int = 0, limit: int = 1000) -> list[AuditRecord]: ...


@dataclass(frozen=True)
class AuditEntry:
    """One stored event as an auditor reads it.

    Attributes:
        position: storage order within the session (increasing, not contiguous).
        at: when its command began (UTC), the same for every event of one command;
            None only for an event stored without a timestamp.
        aggregate: its stream: ``session``, ``conversation/<id>`` or ``task/<id>``.
        version: its version within that stream.
        event: its type, e.g. ``Conversation.EntryAppended``.
        payload: its fields; JSON text fields (entry ``content``/``metadata``, state
            ``value``, task ``state``) decoded to the JSON values they hold.
        owner, host, pid: the claim current when its batch was written (the batch's own
            ``Session.Claimed``, else the last one before it); None before any claim.
        task: the task whose execution wrote its batch; None for a caller's command (and
            for batches written before boundaries recorded it).
    """

    position: int
    at: datetime | None
    aggregate: str
    version: int
    event: str
    payload: JsonObject
    owner: str | None
    host: str | None
    pid: int | None
    task: int | None

    def to_json(self) -> JsonObject:
        """The record as one JSON object, fields in ``AUDIT_COLUMNS`` order."""
        return {
            "position": self.position,
            "at": None if self.at is None else self.at.isoformat(),
            "aggregate": self.aggregate,
            "version": self.version,
            "event": self.event,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "task": self.task,
            "payload": self.payload,
        }


@dataclass(frozen=True)
class _Claim:
    owner: str | None = None
    host: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class _Filter:
    conversation: int | None
    task: int | None
    events: frozenset[str] | None
    since: datetime | None
    until: datetime | None
    after: int
    before: int | None

    def keeps(self, r: AuditRecord, batch_task: int | None) -> bool:
        if r.position <= self.after or (self.before is not None and r.position >= self.before):
            return False
        if self.events is not None and r.event not in self.events:
            return False
        if self.conversation is not None and r.payload.get("conversation_id") != self.conversation:
            return False
        if self.task is not None and batch_task != self.task and r.aggregate != f"task/{self.task}":
            return False
        if self.since is not None or self.until is not None:
            if r.timestamp is None:
                return False
            if self.since is not None and r.timestamp < self.since:
                return False
            if self.until is not None and r.timestamp >= self.until:
                return False
        return True


def audit_records(
    source: AuditSource,
    *,
    conversation: int | None = None,
    task: int | None = None,
    events: Iterable[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: int = 0,
    before: int | None = None,
    page: int = AUDIT_PAGE,
    progress: Callable[[int], None] | None = None,
) -> Iterator[AuditEntry]:
    """The session's stored events as ``AuditEntry`` records, in storage order, read lazily
    ``page`` events at a time (memory: one page and one batch, for any log length).

    Args:
        source: a ``Harness`` (read-only handles append no claim) or a ``Storage``.
        conversation: only events naming conversation ``conversation`` (``conversation_id``
            in the payload: its own stream, its tasks' creation, its designation as root,
            its link to an owning task).
        task: only task ``task``'s own events and the events of batches its execution wrote.
        events: only these event types (names as in ``EVENT_TYPES``).
        since: only events stored at or after this time (timezone-aware).
        until: only events stored before this time (timezone-aware).
        after: only events after this position (exclusive; 0: from the start).
        before: only events before this position (exclusive).
        page: events per storage read.
        progress: called with the number of stored events each page read (for a progress
            bar); filtered-out events count too.

    Raises:
        InvalidArgumentError: at once (before anything is read) for a filter outside its
            range: an id that is not a positive integer, an unknown event type, a naive
            datetime, ``since`` later than ``until``, a negative position, ``before`` not
            after ``after``, a page outside 1..1,000,000.
        StorageCorruptError: while streaming, for a JSON text field that does not decode
            (its position named).
    """
    selected = _Filter(
        conversation=None if conversation is None else check_id(conversation, "conversation"),
        task=None if task is None else check_id(task, "task"),
        events=_event_types(events),
        since=_aware(since, "since"),
        until=_aware(until, "until"),
        after=check_position(after, "after"),
        before=check_optional_position(before, "before"),
    )
    if selected.since and selected.until and selected.since > selected.until:
        raise InvalidArgumentError(
            f"since ({selected.since.isoformat()}) is later than until "
            f"({selected.until.isoformat()}); give a time range that starts before it ends"
        )
    if selected.before is not None and selected.before <= selected.after:
        raise InvalidArgumentError(
            f"before ({selected.before}) must be greater than after ({selected.after}): no "
            "position lies between them"
        )
    check_limit(page, "page", maximum=1_000_000)
    return _stream(source, selected, page, progress)


def _event_types(events: Iterable[str] | None) -> frozenset[str] | None:
    if events is None:
        return None
    if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
        raise InvalidArgumentError(
            f"events must be a list of event type names, got {events!r}; e.g. "
            "['Conversation.EntryAppended']"
        )
    chosen = list(events)
    for name in chosen:
        if name not in EVENT_TYPES:
            raise InvalidArgumentError(
                f"unknown event type {name!r}; pick from: {', '.join(sorted(EVENT_TYPES))}"
            )
    return frozenset(chosen)


def _aware(value: datetime | None, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidArgumentError(
            f"{what} must be a timezone-aware datetime, got {value!r} ({type(value).__name__})"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgumentError(
            f"{what} ({value.isoformat()}) has no timezone, so the instant it names is "
            "unknown; pass an aware datetime, e.g. datetime(..., tzinfo=UTC)"
        )
    return value.astimezone(UTC)


def _stream(
    source: AuditSource,
    selected: _Filter,
    page: int,
    progress: Callable[[int], None] | None,
) -> Iterator[AuditEntry]:
    claim = _claim_at(source, selected.after, page, progress) if selected.after else _Claim()
    cursor = selected.after
    batch: list[AuditRecord] = []
    while True:
        records = source.audit(after=cursor, limit=page)
        if progress is not None and records:
            progress(len(records))
        for r in records:
            batch.append(r)
            if r.event not in BOUNDARY_NAMES:
                continue
            if r.event == "Session.Claimed":
                claim = _claim_of(r)
            yield from _entries(batch, claim, selected)
            batch = []
            if selected.before is not None and r.position >= selected.before - 1:
                return  # the batch holding the last wanted position is complete
        if len(records) < page:
            break
        cursor = records[-1].position
    yield from _entries(batch, claim, selected)  # a log cut before its boundary


def _claim_at(
    source: AuditSource, position: int, page: int, progress: Callable[[int], None] | None
) -> _Claim:
    """The last claim stored at or before ``position``: the log has no index of claims,
    so this reads the events before it (constant memory, linear time)."""
    claim, cursor = _Claim(), 0
    while cursor < position:
        records = source.audit(after=cursor, limit=page)
        for r in records:
            if r.position > position:
                return claim
            if r.event == "Session.Claimed":
                claim = _claim_of(r)
        if len(records) < page:
            break
        cursor = records[-1].position
    return claim


def _claim_of(r: AuditRecord) -> _Claim:
    owner, host, pid = r.payload.get("owner"), r.payload.get("host"), r.payload.get("pid")
    return _Claim(
        owner=owner if isinstance(owner, str) else None,
        host=host if isinstance(host, str) else None,
        pid=pid if isinstance(pid, int) else None,
    )


def _entries(batch: list[AuditRecord], claim: _Claim, selected: _Filter) -> Iterator[AuditEntry]:
    if not batch:
        return
    boundary = batch[-1]
    written_by = boundary.payload.get("task") if boundary.event == "Session.Committed" else None
    task = written_by if isinstance(written_by, int) else None
    for r in batch:
        if selected.keeps(r, task):
            yield AuditEntry(
                position=r.position,
                at=None if r.timestamp is None else r.timestamp.astimezone(UTC),
                aggregate=r.aggregate,
                version=r.version,
                event=r.event,
                payload=_decoded(r),
                owner=claim.owner,
                host=claim.host,
                pid=claim.pid,
                task=task,
            )


def _decoded(r: AuditRecord) -> JsonObject:
    payload: JsonObject = dict(r.payload)
    for name in JSON_TEXT_FIELDS.get(r.event, ()):
        text = payload.get(name)
        if text is None:
            continue
        if not isinstance(text, str):
            raise _corrupt(r, name, f"holds {type(text).__name__}, not JSON text")
        try:
            value: JsonValue = loads(text)
        except ValueError as exc:
            raise _corrupt(r, name, f"is not JSON text ({exc})") from None
        payload[name] = value
    return payload


def _corrupt(r: AuditRecord, name: str, what: str) -> StorageCorruptError:
    return StorageCorruptError(
        f"the {r.event} event at position {r.position} ({r.aggregate} version {r.version}): "
        f"its {name} field {what}; run pico check URL --session S to list the damage and "
        "restore the session from a backup"
    )
