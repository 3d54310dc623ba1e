"""Tamper evidence, as the application sees it: the report of a hash chain verification,
and the explicit command that anchors a session written before the chain.

The chain itself is computed by storage while it encodes each batch (its stored bodies are
what it covers); see ``pico.infrastructure.chain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChainBreak", "ChainReport"]


@dataclass(frozen=True)
class ChainBreak:
    """Where the recomputed chain and the stored one part."""

    #: The first stored position of the batch whose link does not match.
    position: int
    #: The batch's last position (its boundary).
    last: int
    message: str
    #: ``link``: a batch does not match its link (or lost it); ``anchor``: anchored history
    #: changed; ``tail``: events after the last boundary; ``decode``: an event that does not
    #: decode or match its schema.
    kind: str = "link"

    def __str__(self) -> str:
        return f"position {self.position}: {self.message}"


@dataclass
class ChainReport:
    """What a verification found: the events it read, the last position, the head link."""

    session: str
    events: int = 0
    batches: int = 0
    #: The last position read (0: an empty log).
    through: int = 0
    #: The last boundary's stored link ("" when it has none). Record it: a later verify
    #: that ends before it, or with another head, shows the newest batches were removed.
    head_link: str = ""
    #: Events before the first linked boundary that no anchor covers (written before the
    #: chain); ``unchained_through`` is the position of the last of them.
    unchained: int = 0
    unchained_through: int = 0
    #: The position of the ``Session.ChainStarted`` that anchors them, when one does.
    anchored_at: int | None = None
    breaks: list[ChainBreak] = field(default_factory=list)
    #: Events after the last boundary: an unfinished batch (never committed).
    tail: int = 0

    @property
    def ok(self) -> bool:
        return not self.breaks

    def summary(self) -> str:
        """One line: "verified N events through position P ..." or the first break."""
        if self.breaks:
            return (
                f"session {self.session!r}: history was changed, first at position "
                f"{self.breaks[0].position} ({len(self.breaks)} break(s) in {self.events} "
                f"events through position {self.through})"
            )
        covered = self.events - self.unchained - self.tail
        text = (
            f"verified {covered} events through position {self.through} "
            f"(session {self.session!r}, head link {self.head_link or 'none'})"
        )
        if self.unchained:
            text += (
                f"; {self.unchained} earlier events through position "
                f"{self.unchained_through} were written before the hash chain and are not "
                "covered: anchor them with `pico verify --start-chain`"
            )
        elif self.anchored_at is not None:
            text += f"; the events before position {self.anchored_at} are covered by its anchor"
        if self.tail:
            text += f"; {self.tail} events after the last boundary were never committed"
        return text
