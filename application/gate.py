"""The resume gate (seed 000, "The resume gate"): the configuration fingerprint a
session's agent work is written under, and what a reopen under a different one does.

``Harness.open`` computes the fingerprint for agent work (a provider given, not read-only)
from what it was given, BEFORE any resume reminder is appended to the system prompt, so a
reminder can never perturb the comparison. The first open records it
(``Session.ConfigurationRecorded``); the Session aggregate holds the current one (snapshots
carry it), so a reopen compares without reading history. Each field is classed in
``FIELDS``:

=====================  ========  ===================================================
field                  class     value
=====================  ========  ===================================================
``model``              hard      the model name given to ``Harness.open``
``provider_options``   blocking  canonical JSON of ``provider.fingerprint()`` (``{}``
                                 when the provider has no such method); sha256 when
                                 longer than 200 characters. A provider names itself
                                 and its options here; its Python class is not part of
                                 the fingerprint (fakes, wrappers and a crashed
                                 process's replacement differ in class only)
``system``             blocking  ``sha256:<hex>`` of the system prompt (never verbatim)
``tool_execution``     blocking  ``"parallel"`` or ``"sequential"``
``tool:<name>``        tools     ``sha256:<hex>`` of the tool's canonical spec: name,
                                 description, parameter schema, replay, sequential
``max_attempts``       budget    model requests per generation (and collapse)
``retry_delay``        budget    seconds before retry n is ``retry_delay * n``
``context_budget``     budget    estimated tokens before an automatic collapse (or None)
=====================  ========  ===================================================

On reopen, per class of the fields that differ: **hard** refuses the open with
``ConfigurationMismatchError`` before the claim (nothing is written); **blocking** opens,
records nothing and drives nothing (``drive`` raises ``ConfigurationMismatchError``) until
``Harness.acknowledge_configuration()`` records ``Session.ConfigurationChanged`` with
``acknowledged=True``; **tools** and **budget** are accepted at once and recorded as
``ConfigurationChanged`` with ``acknowledged=False``. A budget change applies to new
attempts only: the same command re-captures ``max_attempts`` in every live agent task, so
attempts already made stay counted and the next attempt is checked against the new limit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pico.application.command import Command
from pico.application.flows.common import AgentServices
from pico.domain.errors import ConfigurationMismatchError
from pico.domain.json import strict_json
from pico.domain.session import Session

__all__ = [
    "FIELDS",
    "ConfigurationGate",
    "FieldClass",
    "Fingerprint",
    "field_class",
    "fingerprint",
]

FieldClass = Literal["hard", "blocking", "tools", "budget"]
Fingerprint = dict[str, str | int | float | None]

#: The ONE table of fingerprint fields and their classes (``tool:<name>`` is per tool).
FIELDS: dict[str, FieldClass] = {
    "model": "hard",
    "provider_options": "blocking",
    "system": "blocking",
    "tool_execution": "blocking",
    "tool:*": "tools",
    "max_attempts": "budget",
    "retry_delay": "budget",
    "context_budget": "budget",
}

#: The agent task kinds whose state captures ``max_attempts`` (re-captured on a change).
_BUDGETED_KINDS = ("generation", "post_tools", "collapse")


def field_class(name: str) -> FieldClass:
    """The class of a fingerprint field; a field this pico does not know (written by a
    newer one) is hard: refusing is the conservative reading."""
    if name.startswith("tool:"):
        return FIELDS["tool:*"]
    return FIELDS.get(name, "hard")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def provider_options(provider: object) -> str:
    """What a provider exposes about its options: the sha256 of the canonical JSON of
    ``provider.fingerprint()`` (a JSON object, e.g. ``{"temperature": 0.2}``; ``{}``
    without the method). Always a hash: the event log is permanent, and a provider's
    options may name an endpoint, an organisation or worse."""
    method = getattr(provider, "fingerprint", None)
    options = strict_json(method() if callable(method) else {}, what="provider fingerprint()")
    return _sha256(_canonical(options))


def fingerprint(services: AgentServices, *, system: str | None = None) -> Fingerprint:
    """The fingerprint of what ``services`` writes agent work under. ``system`` is the
    configured prompt (before any resume reminder); default ``services.system``."""
    out: Fingerprint = {
        "model": services.model,
        "provider_options": provider_options(services.provider),
        "system": _sha256(services.system if system is None else system),
        "tool_execution": services.tool_execution,
        "max_attempts": services.max_attempts,
        "retry_delay": float(services.retry_delay),
        "context_budget": services.context_budget,
    }
    for name in services.tools.names():
        tool = services.tools.get(name)
        assert tool is not None
        spec = {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "replay": tool.replay,
            "sequential": tool.sequential,
        }
        out[f"tool:{name}"] = _sha256(_canonical(spec))
    return out


def _rank(name: str) -> tuple[int, str]:
    key = "tool:*" if name.startswith("tool:") else name
    return (list(FIELDS).index(key) if key in FIELDS else len(FIELDS), name)


def differences(recorded: Fingerprint, current: Fingerprint) -> list[dict[str, Any]]:
    """Each field that differs, ``{field, class, before, after}`` (None: absent), in the
    order of the table, tools by name."""
    return [
        {"field": n, "class": field_class(n), "before": recorded.get(n), "after": current.get(n)}
        for n in sorted(recorded.keys() | current.keys(), key=_rank)
        if n not in recorded or n not in current or recorded[n] != current[n]
    ]


@dataclass
class ConfigurationGate:
    """One write open's gate: ``check`` runs on the loaded Session aggregate before the
    claim (``CommandLine.open``); ``record`` writes what the open (or the acknowledgement)
    accepted, and ``accepted`` notes it once that command committed."""

    session_id: str
    current: Fingerprint
    recorded: Fingerprint | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        """The session had a fingerprint already: this open resumes agent work."""
        return self.recorded is not None

    @property
    def blocking(self) -> bool:
        return any(c["class"] == "blocking" for c in self.changes)

    def check(self, session: Session) -> None:
        """Before the claim, on the aggregate it lands on: compare with the recorded
        fingerprint (a hard change raises; nothing is written), or record the first one
        on the aggregate, so it is saved in the claim's batch."""
        recorded = session.configuration
        self.recorded = None if recorded is None else dict(recorded)
        self.changes = [] if self.recorded is None else differences(self.recorded, self.current)
        hard = [c for c in self.changes if c["class"] == "hard"]
        if hard:
            raise ConfigurationMismatchError(self.session_id, hard, hard=True)
        if recorded is None:
            session.record_configuration(fingerprint=dict(self.current))

    def pending(self) -> ConfigurationMismatchError | None:
        """What a drive raises while a blocking change waits for acknowledgement."""
        if not self.blocking:
            return None
        return ConfigurationMismatchError(self.session_id, list(self.changes), hard=False)

    def record(self, tx: Command, *, acknowledged: bool, live: Iterable[Any] = ()) -> None:
        """The accepted changes of a reopen (or its acknowledgement), in one command; a
        budget change re-captures ``max_attempts`` in live agent tasks in the same
        command. Nothing when nothing changed."""
        if self.changes:
            tx.change_configuration(
                dict(self.current), [dict(c) for c in self.changes], acknowledged=acknowledged
            )
            moved = self.current.get("max_attempts")
            if any(c["field"] == "max_attempts" for c in self.changes) and isinstance(moved, int):
                for task in live:
                    state = task.state
                    if (
                        task.kind in _BUDGETED_KINDS
                        and isinstance(state, dict)
                        and isinstance(state.get("max_attempts"), int)
                        and state["max_attempts"] != moved
                    ):
                        tx.patch_task(task.id, state={**state, "max_attempts": moved})

    def accepted(self) -> None:
        """The record committed: the current fingerprint is the recorded one now."""
        self.recorded = dict(self.current)
        self.changes = []
