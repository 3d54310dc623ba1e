"""Entry references and the tool-call/result exchange rule of §2.3.

An entry opens an exchange when its metadata has ``tool_calls`` (a list of call ids) and
answers one when its metadata has ``tool_call_id``. Context edits must never split an
exchange: an answer is selectable only while its call is selected, a prefix replacement
may not separate a call from its answers, and no replacement or reset happens while a
selected call is unanswered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pico.domain.errors import ExchangeSplitError
from pico.domain.json import JsonValue

__all__ = ["EntryRef", "ExchangeDelta", "complete_exchange"]


@dataclass(frozen=True)
class EntryRef:
    """What validation needs to know of an entry: never its content."""

    id: int
    conversation_id: int
    tool_calls: tuple[str, ...] = ()
    tool_call_id: str | None = None

    @staticmethod
    def from_metadata(
        entry_id: int, conversation_id: int, metadata: Mapping[str, JsonValue] | None
    ) -> EntryRef:
        calls: tuple[str, ...] = ()
        answer: str | None = None
        if metadata:
            raw_calls = metadata.get("tool_calls")
            if isinstance(raw_calls, list):
                calls = tuple(str(c) for c in raw_calls)
            raw_answer = metadata.get("tool_call_id")
            if isinstance(raw_answer, str):
                answer = raw_answer
        return EntryRef(entry_id, conversation_id, calls, answer)


@dataclass
class ExchangeDelta:
    """Exchange facts of a set of context ids, in event-payload shape (JSON friendly)."""

    calls: dict[str, list[str]] = field(default_factory=dict)  # opener id -> call ids
    answers: dict[str, str] = field(default_factory=dict)  # answer id -> call id


def complete_exchange(
    conversation_id: int, ids: Iterable[int], refs: Mapping[int, EntryRef]
) -> ExchangeDelta:
    """Describe the exchanges among ``ids``; reject when any is incomplete."""
    delta = ExchangeDelta()
    open_calls: dict[str, int] = {}
    for entry_id in ids:
        ref = refs[entry_id]
        if ref.tool_call_id is not None:
            if ref.tool_call_id not in open_calls:
                raise ExchangeSplitError(
                    conversation_id,
                    f"entry {entry_id} answers tool call {ref.tool_call_id!r} whose call is "
                    "not selected before it; select the whole exchange or none of it",
                )
            del open_calls[ref.tool_call_id]
            delta.answers[str(entry_id)] = ref.tool_call_id
        if ref.tool_calls:
            delta.calls[str(entry_id)] = list(ref.tool_calls)
            for call in ref.tool_calls:
                open_calls[call] = entry_id
    if open_calls:
        call, opener = next(iter(open_calls.items()))
        raise ExchangeSplitError(
            conversation_id,
            f"entry {opener} calls tool {call!r} but its result is not selected; an "
            "incomplete tool exchange cannot be selected or forked from",
        )
    return delta
