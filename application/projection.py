"""Projection (§2.2): the context selects entries; projection converts them to messages.

An entry's kind defines its contribution; projection reads content and returns messages,
writing nothing. Placement entries refer to admission entries and are resolved in ONE
batched read; tool results are normalized into the assistant's call order; consecutive user
messages are merged, because providers reject two user messages in a row (seed 000).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pico.application.model import (
    ImagePart,
    Message,
    Messages,
    Part,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)
from pico.application.ports import ReadPort
from pico.domain.errors import StorageCorruptError
from pico.domain.json import JsonValue
from pico.domain.values import Entry

__all__ = ["KindProjection", "Projection", "ProjectionCache", "project_context"]

KindProjection = Callable[[Entry], Message | None]


def _text(content: JsonValue) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        value = content.get("text", content.get("content"))
        if isinstance(value, str):
            return value
    if isinstance(content, list):
        return "\n".join(c for c in content if isinstance(c, str))
    return ""


def user_message(entry: Entry) -> Message:
    return Message("user", (TextPart(_text(entry.content)),))


def assistant_message(entry: Entry) -> Message:
    content = entry.content
    parts: list[Part] = []
    if isinstance(content, dict):
        blocks = content.get("thinking_blocks")
        thinking = content.get("thinking")
        if isinstance(blocks, list):  # signed thinking, block by block
            for block in blocks:
                if isinstance(block, dict):
                    parts.append(
                        ThinkingPart(str(block.get("text", "")), str(block.get("signature", "")))
                    )
        elif isinstance(thinking, str) and thinking:
            parts.append(ThinkingPart(thinking))
        text = content.get("text")
        if isinstance(text, str) and text:
            parts.append(TextPart(text))
        calls = content.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                args = call.get("arguments")
                parts.append(
                    ToolCallPart(
                        str(call.get("id")),
                        str(call.get("name")),
                        args if isinstance(args, dict) else {},
                    )
                )
    else:
        parts.append(TextPart(_text(content)))
    return Message("assistant", tuple(parts))


def tool_result_message(entry: Entry) -> Message:
    call_id = (entry.metadata or {}).get("tool_call_id")
    content = entry.content
    is_error = isinstance(content, dict) and content.get("is_error") is True
    raw = content.get("images") if isinstance(content, dict) else None
    images = tuple(
        ImagePart(str(i.get("mime")), str(i.get("data")))
        for i in (raw if isinstance(raw, list) else [])
        if isinstance(i, dict)
    )
    return Message("user", (ToolResultPart(str(call_id), _text(content), is_error, images),))


DEFAULT_KINDS: dict[str, KindProjection] = {
    "user": user_message,
    "assistant": assistant_message,
    "tool": tool_result_message,
    "summary": user_message,
    "handoff": user_message,
}


class Projection:
    """Kind -> contribution. Unknown kinds (notes, custom records) project nothing."""

    def __init__(self, kinds: Mapping[str, KindProjection] | None = None) -> None:
        self.kinds = dict(DEFAULT_KINDS if kinds is None else kinds)

    def placement_ref(self, entry: Entry) -> int | None:
        if entry.kind != "placement":
            return None
        content = entry.content
        ref = content.get("input") if isinstance(content, dict) else None
        return ref if isinstance(ref, int) else None

    def one(self, entry: Entry, referenced: Mapping[int, Entry]) -> Message | None:
        """One entry's contribution (None: nothing)."""
        ref = self.placement_ref(entry)
        if ref is not None:
            source = referenced.get(ref)
            if source is None:
                raise StorageCorruptError(
                    f"placement entry {entry.id} refers to missing admission entry {ref}"
                )
            entry = source
        kind = self.kinds.get(entry.kind)
        message = kind(entry) if kind is not None else None
        return message if message is not None and message.parts else None

    def messages(self, entries: Sequence[Entry], referenced: Mapping[int, Entry]) -> list[Message]:
        projected = [m for m in (self.one(e, referenced) for e in entries) if m is not None]
        return _merge_users(_normalize_results(projected))


def _normalize_results(messages: list[Message]) -> list[Message]:
    """Tool results answer the latest assistant's calls; order each run of them by call
    order (completion order may differ; the transcript is unchanged)."""
    out: list[Message] = []
    order: dict[str, int] = {}
    run: list[Message] = []

    def flush() -> None:
        run.sort(key=lambda m: order.get(_call_id(m), len(order)))
        out.extend(run)
        run.clear()

    for message in messages:
        if message.role == "user" and all(isinstance(p, ToolResultPart) for p in message.parts):
            run.append(message)
            continue
        flush()
        if message.role == "assistant" and message.tool_calls:
            order = {c.id: i for i, c in enumerate(message.tool_calls)}
        out.append(message)
    flush()
    return out


def _call_id(message: Message) -> str:
    part = message.parts[0]
    return part.call_id if isinstance(part, ToolResultPart) else ""


def _merge_users(messages: list[Message]) -> list[Message]:
    merged: list[Message] = []
    for message in messages:
        if merged and message.role == "user" and merged[-1].role == "user":
            merged[-1] = Message("user", merged[-1].parts + message.parts)
        else:
            merged.append(message)
    return merged


@dataclass
class _Incremental:
    """A conversation's projection so far. Appends never change messages before the last
    assistant message (runs and merges stop at it), so only the window from there on is
    re-normalized when entries arrive."""

    revision: int
    last_position: int | None
    stable: list[Message] = field(default_factory=list)
    window: list[Message] = field(default_factory=list)


class ProjectionCache:
    """Projected messages by entry id (entries are immutable: nothing is ever stale) and,
    per conversation, the incremental projection of its current context. Bounded, least
    recently used first. Measured: without it, per-turn cost grew with the conversation."""

    def __init__(self, capacity: int = 100_000, conversations: int = 64) -> None:
        self.capacity = capacity
        self._messages: OrderedDict[int, Message | None] = OrderedDict()
        self._conversations: OrderedDict[int, _Incremental] = OrderedDict()
        self._conversation_capacity = conversations

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._messages

    def get(self, entry_id: int) -> Message | None:
        self._messages.move_to_end(entry_id)
        return self._messages[entry_id]

    def put(self, entry_id: int, message: Message | None) -> None:
        self._messages[entry_id] = message
        self._messages.move_to_end(entry_id)
        while len(self._messages) > self.capacity:
            self._messages.popitem(last=False)

    def state(self, conversation_id: int) -> _Incremental | None:
        found = self._conversations.get(conversation_id)
        if found is not None:
            self._conversations.move_to_end(conversation_id)
        return found

    def keep(self, conversation_id: int, state: _Incremental) -> None:
        self._conversations[conversation_id] = state
        self._conversations.move_to_end(conversation_id)
        while len(self._conversations) > self._conversation_capacity:
            self._conversations.popitem(last=False)


def _project_entries(
    reads: ReadPort, ids: Sequence[int], projection: Projection, cache: ProjectionCache
) -> list[Message]:
    """Per-entry messages for ``ids``: read and decode only the ones not cached."""
    missing = [i for i in ids if i not in cache]
    if missing:
        found = reads.get_entries(missing)
        entries = [found[i] for i in missing if i in found]
        refs = [r for r in (projection.placement_ref(e) for e in entries) if r is not None]
        referenced = reads.get_entries(refs) if refs else {}
        for entry in entries:
            cache.put(entry.id, projection.one(entry, referenced))
    return [m for m in (cache.get(i) for i in ids if i in cache) if m is not None]


def project_context(
    reads: ReadPort,
    conversation_id: int,
    projection: Projection | None = None,
    *,
    as_of: int | None = None,
    cache: ProjectionCache | None = None,
) -> Sequence[Message]:
    """The provider messages of a conversation's context (§2.2).

    With a cache and no ``as_of``, only context elements appended since the last request are
    read, and only messages after the last assistant message are re-normalized: per-turn
    cost does not grow with the conversation."""
    projection = projection or Projection()
    if as_of is not None or cache is None:
        snapshot = reads.get_conversations([conversation_id], as_of).get(conversation_id)
        if snapshot is None:
            return ()
        local = ProjectionCache(capacity=len(snapshot.context) + 1)
        return tuple(
            _merge_users(
                _normalize_results(_project_entries(reads, snapshot.context, projection, local))
            )
        )
    state = cache.state(conversation_id)
    tail = reads.context_tail(conversation_id, state.last_position if state else None)
    if tail is None:
        return ()
    revision, elements = tail
    if state is None or state.revision != revision:  # a replacement or reset: start over
        if state is not None:
            full = reads.context_tail(conversation_id, None)
            assert full is not None
            revision, elements = full
        state = _Incremental(revision, None)
    if elements:
        state.window.extend(_project_entries(reads, [e for _, e in elements], projection, cache))
        state.last_position = elements[-1][0]
        last = max((k for k, m in enumerate(state.window) if m.role == "assistant"), default=0)
        if last > 0:  # everything before the last assistant message is final
            state.stable.extend(_merge_users(_normalize_results(state.window[:last])))
            state.window = state.window[last:]
    cache.keep(conversation_id, state)
    # The settled messages are shared with earlier requests, not copied (model.Messages).
    return Messages(
        state.stable, len(state.stable), tuple(_merge_users(_normalize_results(state.window)))
    )
