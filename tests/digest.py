"""A digest of everything a session lets a caller read, through the public API only.

Used to prove a rejected command changed nothing: compare ``state_digest`` before and after.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import pico


async def _all_values(h: pico.Harness, **scope: Any) -> list[Any]:
    out: list[Any] = []
    after = None
    while True:
        page = await h.scan_values(after=after, limit=1000, **scope)
        out.extend(asdict(v) for v in page.items)
        if page.next is None:
            return out
        after = page.next


async def state_digest(
    h: pico.Harness,
    *,
    lists: Iterable[Any] = (),
    working: Sequence[pico.WorkingScope] = (),
) -> str:
    """sha256 of the transcript, context, values, lists and tasks of every conversation.

    ``lists`` are list addresses to read (lists have no scan); session and working lists
    are read once, conversation lists in every conversation. ``working`` scopes are
    scanned for values.
    """
    lists = list(lists)
    state: dict[str, Any] = {"head": h.head(), "main_head": h.main_head()}
    conversations = (await h.conversations(limit=1000)).items
    state["conversations"] = [asdict(c) for c in conversations]
    for c in conversations:
        handle = await h.conversation(c.id)
        assert handle is not None
        entries = (await h.entries(c.id, limit=1000, content=True)).items
        state[f"entries/{c.id}"] = [asdict(e) for e in entries]
        state[f"values/{c.id}"] = [asdict(v) for v in (await handle.scan_values(limit=1000)).items]
        for address in lists:
            if isinstance(address, pico.ConversationList):
                page = await handle.read_list(address, limit=1000)
                state[f"list/{c.id}/{address.namespace}"] = [asdict(i) for i in page.items]
    state["session values"] = await _all_values(h)
    for scope in working:
        state[f"working/{scope.name}"] = await _all_values(h, working=scope)
    for address in lists:
        if not isinstance(address, pico.ConversationList):
            page = await h.read_list(address, limit=1000)
            state[f"list/{address.namespace}"] = [asdict(i) for i in page.items]
    state["tasks"] = [asdict(t) for t in (await h.tasks(limit=1000)).items]
    text = json.dumps(state, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()
