"""The hash chain over commit boundaries: tamper evidence that needs nothing but the log.

Every batch ends with its boundary event (a command's ``Session.Committed``, an opening's
``Session.Claimed``). Its ``link`` is ``sha256:<hex>`` of the previous boundary's link and
the batch's stored events in order: each event's stream id, version, topic and exact body
bytes, the boundary's own body included with its link replaced by ``PLACEHOLDER``. Storage
fills the link in while it encodes the batch (one digest, no extra read or round trip), so
it is written in the batch's own transaction on every backend.

``verify`` recomputes the chain from the log alone. An edited, removed, reordered or
inserted event changes its batch's digest (a removed whole batch changes the next one's),
so the first batch whose link does not match is where history was changed. Boundaries
written before the chain carry no link: they are reported as unchained, never as verified,
until ``Session.ChainStarted`` anchors them (``start_chain``). Truncating the newest batches
leaves a shorter valid chain: an auditor records the head link a verify reports, and a
later verify that does not reach it says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from uuid import UUID

import pydantic_core
from eventsourcing.persistence import StoredEvent

from pico.application.chain import ChainBreak, ChainReport
from pico.domain.ids import stream_hex, stream_uuid
from pico.domain.session import BOUNDARY_TOPICS
from pico.infrastructure.codec import stored_event

__all__ = [
    "PLACEHOLDER",
    "ChainWalk",
    "anchor_of",
    "chain_link",
    "paged",
    "seal_boundary",
    "stored_link",
    "unlinked",
    "verify_chain",
]

#: The algorithm's prefix; a later algorithm gets another.
ALGORITHM = "sha256"
#: What a boundary's link reads as while its batch is hashed: same length as a link.
PLACEHOLDER = ALGORITHM + ":" + "0" * 64
_KEY = b'"link":"'
_PLACEHOLDER_FIELD = _KEY + PLACEHOLDER.encode() + b'"'

_CHAIN_STARTED = "pico.domain.session:Session.ChainStarted"


#: Encoded topics (a few dozen event types): framing is on every commit's path.
_TOPICS: dict[str, bytes] = {}
#: Encoded stream ids (``stream_hex``) by the id's int, found without a call an event.
#: Bounded: past ``_STREAMS_LIMIT`` ids it starts over.
_STREAMS: dict[int, bytes] = {}
_STREAMS_LIMIT = 4096


def _stream(number: int, oid: UUID | str) -> bytes:
    if len(_STREAMS) >= _STREAMS_LIMIT:
        _STREAMS.clear()
    found = _STREAMS[number] = stream_hex(oid).encode()
    return found


def _digest(previous: str, batch: Sequence[StoredEvent], boundary_body: bytes) -> str:
    """The link over ``batch`` (its boundary read as ``boundary_body``): one sha256 over
    the previous link and each event's framed stored body, joined once."""
    parts = [previous.encode()]
    last = len(batch) - 1
    streams = _STREAMS
    for i, stored in enumerate(batch):
        body = boundary_body if i == last else stored.state
        oid = stored.originator_id
        number = (oid if isinstance(oid, UUID) else stream_uuid(oid)).int
        hex_id = streams.get(number) or _stream(number, oid)
        topic = _TOPICS.get(stored.topic)
        if topic is None:
            topic = _TOPICS[stored.topic] = stored.topic.encode()
        parts.append(b"%s %d %s %d\n" % (hex_id, stored.originator_version, topic, len(body)))
        parts.append(body)
    return f"{ALGORITHM}:{hashlib.sha256(b''.join(parts)).hexdigest()}"


def chain_link(previous: str, batch: Sequence[StoredEvent]) -> str:
    """The link a batch's boundary must carry: ``batch[-1]`` is the boundary, read with
    its link replaced by the placeholder."""
    return _digest(previous, batch, unlinked(batch[-1].state))


def seal_boundary(previous: str, batch: list[StoredEvent]) -> str:
    """Compute the batch's link and write it into its boundary's body (in place in
    ``batch``), which storage encoded with ``link = PLACEHOLDER``. Returns the link."""
    boundary = batch[-1]
    body = boundary.state
    if body.count(_PLACEHOLDER_FIELD) != 1:
        raise ValueError(f"boundary {boundary.topic} was not encoded with a placeholder link")
    link = _digest(previous, batch, body)
    batch[-1] = stored_event(
        boundary.originator_id,
        boundary.originator_version,
        boundary.topic,
        body.replace(_PLACEHOLDER_FIELD, _KEY + link.encode() + b'"'),
    )
    return link


def unlinked(body: bytes) -> bytes:
    """A boundary body with its link (whatever it is) read as the placeholder."""
    start = body.find(_KEY)
    if start < 0:
        return body
    end = body.find(b'"', start + len(_KEY))
    return body[:start] + _PLACEHOLDER_FIELD + body[end + 1 :]


def _legacy(body: bytes) -> bool:
    """A boundary body as pico wrote it before the chain: version 1, no link field."""
    return _KEY[:-2] not in body and b'"class_version"' not in body


def stored_link(body: bytes) -> str:
    """The link a stored boundary body carries ("" when it has none)."""
    try:
        state = pydantic_core.from_json(body)
    except ValueError:
        return ""
    link = state.get("link", "") if isinstance(state, dict) else ""
    return link if isinstance(link, str) else ""


class _Walk:
    """The running chain: stored links as the storage wrote them (``stored``), and the
    chain recomputed from the first event as if every batch had been linked (``full``: what
    a ``ChainStarted`` anchor must equal)."""

    def __init__(self, report: ChainReport) -> None:
        self.report = report
        self.stored = ""
        self.full = ""
        self.linked = False

    def batch(self, rows: list[tuple[int, StoredEvent]]) -> None:
        report = self.report
        first, last = rows[0][0], rows[-1][0]
        events = [stored for _, stored in rows]
        boundary = events[-1]
        link = stored_link(boundary.state)
        expected = chain_link(self.stored, events)
        full = expected if self.full == self.stored else chain_link(self.full, events)
        for position, stored in rows:
            if stored.topic == _CHAIN_STARTED:
                self._anchor(position, stored, report.events)
        report.events += len(rows)
        report.batches += 1
        report.through = last
        if not link:
            if self.linked or not _legacy(boundary.state):
                # pico writes a version-2 boundary only with its link, and never an
                # unlinked batch after a linked one: the link was stripped.
                self._break(
                    first,
                    last,
                    f"the boundary at position {last} carries no link "
                    + ("after linked batches" if self.linked else "but is a chained version")
                    + ": its link was removed or the batch was inserted",
                )
            else:
                report.unchained = report.events
                report.unchained_through = last
        else:
            self.linked = True
            if link != expected:
                self._break(
                    first,
                    last,
                    f"the batch at positions {first}-{last} does not match its link: an "
                    "event in it was edited, removed, reordered or inserted, or a batch "
                    "before it was removed",
                )
        report.head_link = link
        self.stored = link
        self.full = full

    def _anchor(self, position: int, stored: StoredEvent, before: int) -> None:
        report = self.report
        try:
            state = pydantic_core.from_json(stored.state)
            anchor, count = state["anchor"], state["events"]
        except (ValueError, KeyError, TypeError):
            self._break(position, position, "the chain anchor does not decode", "anchor")
            return
        if count != before or anchor != self.full:
            self._break(
                position,
                position,
                f"the history before the anchor at position {position} was changed since it "
                f"was anchored ({count} events then, {before} now; their chain no longer "
                "matches the anchor)",
                "anchor",
            )
            return
        report.unchained = 0
        report.unchained_through = 0
        report.anchored_at = position

    def _break(self, first: int, last: int, message: str, kind: str = "link") -> None:
        self.report.breaks.append(ChainBreak(first, last, message, kind))


class ChainWalk:
    """The chain recomputed one stored event at a time (``feed`` in storage order, then
    ``finish``), for a reader that walks the log for other reasons too (``pico check``)."""

    def __init__(self, session: str) -> None:
        self.report = ChainReport(session)
        self._walk = _Walk(self.report)
        self._batch: list[tuple[int, StoredEvent]] = []

    def feed(self, position: int, stored: StoredEvent) -> None:
        self._batch.append((position, stored))
        if stored.topic in BOUNDARY_TOPICS:
            self._walk.batch(self._batch)
            self._batch = []

    def finish(self) -> ChainReport:
        batch, report = self._batch, self.report
        if batch:
            # pico stores a batch with its boundary in one transaction: events after the
            # last boundary were appended, or their boundary was removed.
            report.tail = len(batch)
            report.events += len(batch)
            report.through = batch[-1][0]
            self._walk._break(
                batch[0][0],
                batch[-1][0],
                f"{len(batch)} event(s) at positions {batch[0][0]}-{batch[-1][0]} follow the "
                "last commit boundary: their boundary was removed or they were appended",
                "tail",
            )
            self._batch = []
        return report


def verify_chain(session: str, rows: Iterable[tuple[int, StoredEvent]]) -> ChainReport:
    """Recompute the chain over a session's stored events in storage order."""
    walk = ChainWalk(session)
    for position, stored in rows:
        walk.feed(position, stored)
    return walk.finish()


def anchor_of(rows: Iterable[tuple[int, StoredEvent]]) -> tuple[str, int, bool]:
    """The anchor a ``ChainStarted`` records: the chain recomputed over every stored event
    as if each batch had been linked, the number of events, and whether any boundary is
    unchained and not yet anchored (nothing to anchor otherwise)."""
    full, count, unchained = "", 0, False
    batch: list[StoredEvent] = []
    for _, stored in rows:
        batch.append(stored)
        count += 1
        if stored.topic == _CHAIN_STARTED:
            unchained = False  # anchored already: only later unchained batches count
        if stored.topic in BOUNDARY_TOPICS:
            if not stored_link(stored.state):
                unchained = True
            full = chain_link(full, batch)
            batch = []
    return full, count, unchained


def paged(select: Any, session: str, *, page: int = 1000) -> Iterator[tuple[int, StoredEvent]]:
    """A session's stored events in storage order, read ``page`` at a time."""
    after = 0
    while True:
        rows = select(session, after=after, limit=page)
        if not rows:
            return
        yield from rows
        after = rows[-1][0]
