"""The Session aggregate: the commit boundary stream and the writer fence.

Every command appends exactly one ``Committed`` event here, and every opening for write
appends a ``Claimed`` event first. Because all of a command's events are saved in one atomic
save together with the next Session version, a stale owner's next commit conflicts on this
stream and stores nothing (seed 000, "Claiming a run").
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from pico.domain.errors import CommandRejectedError, SequenceExhaustedError
from pico.domain.ids import MAX_SEQ, session_uuid

__all__ = ["MAIN", "Session"]

#: The scope name of main (retained, historical) commits.
MAIN = "main"


class Session(Aggregate):
    class Created(Aggregate.Created):
        session_id: str

    class Claimed(Aggregate.Event):
        owner: str
        host: str
        pid: int

    class Committed(Aggregate.Event):
        first: int
        last: int
        scope: str

    class RootDesignated(Aggregate.Event):
        conversation_id: int

    @staticmethod
    def create_id(session_id: str, **_: Any) -> UUID:
        return session_uuid(session_id)

    @event(Created)
    def __init__(self, *, session_id: str) -> None:
        self.session_id = session_id
        self.head = 0
        self.main_head = 0
        self.root_id: int | None = None
        self.owner: str | None = None

    def next_seq(self, allocated: int) -> int:
        """The number after ``allocated`` ids of an unfinished batch; rejects on exhaustion."""
        seq = self.head + allocated + 1
        if seq > MAX_SEQ:
            raise SequenceExhaustedError(self.head + allocated)
        return seq

    def claim(self, *, owner: str, host: str, pid: int) -> None:
        self._claimed(owner=owner, host=host, pid=pid)

    def commit(self, *, first: int, last: int, scope: str = MAIN) -> None:
        if first != self.head + 1 or last < first or last > MAX_SEQ:
            raise CommandRejectedError(
                f"session {self.session_id!r}: batch [{first}, {last}] does not follow the "
                f"high-water mark {self.head}"
            )
        self._committed(first=first, last=last, scope=scope)

    def designate_root(self, conversation_id: int) -> None:
        if self.root_id is not None:
            raise CommandRejectedError(
                f"session {self.session_id!r} already has root conversation {self.root_id}"
            )
        self._root_designated(conversation_id=conversation_id)

    @event(Claimed)
    def _claimed(self, owner: str, host: str, pid: int) -> None:
        self.owner = owner

    @event(Committed)
    def _committed(self, first: int, last: int, scope: str) -> None:
        self.head = last
        if scope == MAIN:
            self.main_head = last

    @event(RootDesignated)
    def _root_designated(self, conversation_id: int) -> None:
        self.root_id = conversation_id
