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
from pico.domain.trigger import trigger_event as fast_trigger_event

__all__ = ["BOUNDARIES", "BOUNDARY_NAMES", "BOUNDARY_TOPICS", "MAIN", "Session"]

#: The scope name of main (retained, historical) commits.
MAIN = "main"


class Session(Aggregate):
    # The library's trigger_event less its per-event overhead (domain/trigger.py).
    trigger_event = fast_trigger_event

    class Created(Aggregate.Created):
        session_id: str

    # Boundaries (a command's Committed, an opening's Claimed) carry the batch's hash chain
    # link (infrastructure/chain.py): a digest over the previous boundary's link and the
    # exact stored bodies of the batch, computed and filled in by storage when it encodes
    # the batch. "" on boundaries written before the chain (version 1; see upcasters).
    class Claimed(Aggregate.Event):
        owner: str
        host: str
        pid: int
        link: str

        class_version = 2

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            # Written before the hash chain: no link (fold-as-empty; verify reports the
            # batch as unchained, never as verified).
            state["link"] = ""

        def apply(self, aggregate: Any) -> None:
            aggregate.owner = self.owner
            if self.link:  # "" while its batch is unsaved: storage sets the link
                aggregate.link = self.link

    # The per-command events below apply themselves and are triggered directly: the @event
    # decorator's argument binding cost ~5% of a small command (2,000-turn benchmark).
    class Committed(Aggregate.Event):
        first: int
        last: int
        scope: str
        link: str
        #: The task whose execution wrote the batch (None: a caller's command).
        task: int | None

        class_version = 2

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            # Version 1 had neither field: an unchained boundary of unknown writer.
            state["link"] = ""
            state["task"] = None

        def apply(self, aggregate: Any) -> None:
            aggregate.head = self.last
            if self.scope == MAIN:
                aggregate.main_head = self.last
            if self.link:  # "" while its batch is unsaved: storage sets the link
                aggregate.link = self.link

    class ChainStarted(Aggregate.Event):
        """Anchors a session written before the hash chain: ``anchor`` is the chain
        computed over every one of the ``events`` stored events before this batch, as if
        they had been linked from the start, so a later change to that history is found.
        An explicit command (``Harness.start_chain``), never a silent rewrite."""

        seq: int
        anchor: str
        events: int

    class RootDesignated(Aggregate.Event):
        conversation_id: int

    # Session-scoped state: sticky, one current value or list per address.
    # The state events change nothing in the aggregate (projections apply them): triggered
    # directly by the methods below.
    class ValueSet(Aggregate.Event):
        seq: int
        namespace: str
        key: str
        value: str

    class ValueDeleted(Aggregate.Event):
        seq: int
        namespace: str
        key: str

    class ListAppended(Aggregate.Event):
        seq: int
        namespace: str
        key: str
        value: str

    class ListCleared(Aggregate.Event):
        seq: int
        namespace: str
        key: str

    class WorkingScopeRetired(Aggregate.Event):
        seq: int
        scope: str

    # ------------------------------------------------------------------ the resume gate
    # (application/gate.py; seed 000 "The resume gate"). The configuration fingerprint a
    # session's agent work is written under: a flat object of plain JSON values (the
    # system prompt and each tool as sha256 hashes, never verbatim). The aggregate holds
    # the current one (``configuration``; snapshots carry it), so opening reads it without
    # replaying history.
    class ConfigurationRecorded(Aggregate.Event):
        """The first open for agent work records the fingerprint it is written under, in
        the batch of its claim (before ``Claimed``, so it allocates no number)."""

        fingerprint: dict[str, str | int | float | None]

        def apply(self, aggregate: Any) -> None:
            aggregate.configuration = dict(self.fingerprint)

    class ConfigurationChanged(Aggregate.Event):
        """A reopen under a different fingerprint was accepted: ``changes`` lists each
        ``{field, class, before, after}``; ``acknowledged`` is True when the caller
        accepted a blocking change (``Harness.acknowledge_configuration``), False when a
        tools or budget change was accepted automatically. ``fingerprint`` is the new
        whole fingerprint (the fold sets it)."""

        seq: int
        fingerprint: dict[str, str | int | float | None]
        changes: list[dict[str, str | int | float | None]]
        acknowledged: bool

        def apply(self, aggregate: Any) -> None:
            aggregate.configuration = dict(self.fingerprint)

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
        #: The last boundary's hash chain link ("" before the chain).
        self.link = ""

    def next_seq(self, allocated: int) -> int:
        """The number after ``allocated`` ids of an unfinished batch; rejects on exhaustion."""
        seq = self.head + allocated + 1
        if seq > MAX_SEQ:
            raise SequenceExhaustedError(self.head + allocated)
        return seq

    def claim(self, *, owner: str, host: str, pid: int) -> None:
        self.trigger_event(self.Claimed, owner=owner, host=host, pid=pid, link="")

    def start_chain(self, *, seq: int, anchor: str, events: int) -> None:
        self.trigger_event(self.ChainStarted, seq=seq, anchor=anchor, events=events)

    def commit(self, *, first: int, last: int, scope: str = MAIN, task: int | None = None) -> None:
        if first != self.head + 1 or last < first or last > MAX_SEQ:
            raise CommandRejectedError(
                f"session {self.session_id!r}: batch [{first}, {last}] does not follow the "
                f"high-water mark {self.head}"
            )
        self.trigger_event(self.Committed, first=first, last=last, scope=scope, link="", task=task)

    def designate_root(self, conversation_id: int) -> None:
        if self.root_id is not None:
            raise CommandRejectedError(
                f"session {self.session_id!r} already has root conversation {self.root_id}"
            )
        self._root_designated(conversation_id=conversation_id)

    def set_value(self, *, seq: int, namespace: str, key: str, value: str) -> None:
        self.trigger_event(self.ValueSet, seq=seq, namespace=namespace, key=key, value=value)

    def delete_value(self, *, seq: int, namespace: str, key: str) -> None:
        self.trigger_event(self.ValueDeleted, seq=seq, namespace=namespace, key=key)

    def append_list(self, *, seq: int, namespace: str, key: str, value: str) -> None:
        self.trigger_event(self.ListAppended, seq=seq, namespace=namespace, key=key, value=value)

    def clear_list(self, *, seq: int, namespace: str, key: str) -> None:
        self.trigger_event(self.ListCleared, seq=seq, namespace=namespace, key=key)

    def retire_working_scope(self, *, seq: int, scope: str) -> None:
        """Main retirement ends a working scope's lifetime; storage reclaims its rows."""
        self.trigger_event(self.WorkingScopeRetired, seq=seq, scope=scope)

    @event(RootDesignated)
    def _root_designated(self, conversation_id: int) -> None:
        self.root_id = conversation_id

    # ------------------------------------------------------------------ the resume gate
    #: The recorded configuration fingerprint (None: never opened for agent work). A
    #: class attribute, so a snapshot taken before the gate existed reads as None.
    configuration: dict[str, str | int | float | None] | None = None

    def record_configuration(self, *, fingerprint: dict[str, str | int | float | None]) -> None:
        self.trigger_event(self.ConfigurationRecorded, fingerprint=fingerprint)

    def change_configuration(
        self,
        *,
        seq: int,
        fingerprint: dict[str, str | int | float | None],
        changes: list[dict[str, str | int | float | None]],
        acknowledged: bool,
    ) -> None:
        self.trigger_event(
            self.ConfigurationChanged,
            seq=seq,
            fingerprint=fingerprint,
            changes=changes,
            acknowledged=acknowledged,
        )


#: The events that end a saved batch (its boundary): a command's ``Committed``, an
#: opening's ``Claimed``. Storage seals the hash chain into them; readers cut the log there.
BOUNDARIES = (Session.Committed, Session.Claimed)
#: Their stored topics and audit names.
BOUNDARY_TOPICS = frozenset(f"{cls.__module__}:{cls.__qualname__}" for cls in BOUNDARIES)
BOUNDARY_NAMES = frozenset(cls.__qualname__ for cls in BOUNDARIES)
