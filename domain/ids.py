"""Identity: one session-global sequence; aggregate UUIDs derived from it.

Also the one check of every id, position, page limit and mode argument at the public
boundary, so every backend gives the same typed answer to a malformed one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import NAMESPACE_URL, UUID, SafeUUID, uuid5

from pico.domain.errors import InvalidArgumentError

__all__ = [
    "MAX_ID",
    "MAX_SEQ",
    "check_choice",
    "check_id",
    "check_ids",
    "check_limit",
    "check_optional_id",
    "check_optional_position",
    "check_position",
    "conversation_uuid",
    "invalid_argument",
    "session_uuid",
    "stream_hex",
    "stream_uuid",
    "task_uuid",
]

#: Ids are positive safe integers (§3.1); allocating past this rejects.
MAX_SEQ = 2**53 - 1

_NS = uuid5(NAMESPACE_URL, "pico:aggregate")
#: sha1 over the namespace, copied for each name: ``uuid5`` without its per-call import,
#: byte joins and ``UUID.__init__`` checks (a task's id is most of creating it).
_NS_SHA1 = hashlib.sha1(_NS.bytes)
_VERSION5_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_VERSION5_SET = (0x8000 << 48) | (5 << 76)
_new = object.__new__
_set = object.__setattr__


def _uuid5(name: str) -> UUID:
    """``uuid5(_NS, name)``, the same UUID (tests/unit/test_ids.py holds it to it)."""
    digest = _NS_SHA1.copy()
    digest.update(name.encode())
    value = (int.from_bytes(digest.digest()[:16]) & _VERSION5_CLEAR) | _VERSION5_SET
    uid = _new(UUID)
    _set(uid, "int", value)
    _set(uid, "is_safe", SafeUUID.unknown)
    return uid


def stream_uuid(oid: UUID | str) -> UUID:
    """A stored event's stream id as a UUID: recorders hand back the aggregate's UUID, or
    its text when it was read from storage (no round trip through text for the first)."""
    return oid if isinstance(oid, UUID) else UUID(str(oid))


#: Stream ids as 32 hex digits, by the id's int (``UUID.hex`` is a Python property, and a
#: session's batches keep naming a few streams: its own in every boundary). Bounded: past
#: ``_HEX_LIMIT`` ids it starts over.
_HEX: dict[int, str] = {}
_HEX_LIMIT = 4096


def stream_hex(oid: UUID | str) -> str:
    """``stream_uuid(oid).hex``, made once for each recent stream."""
    number = (oid if isinstance(oid, UUID) else UUID(str(oid))).int  # stream_uuid, inline
    found = _HEX.get(number)
    if found is None:
        if len(_HEX) >= _HEX_LIMIT:
            _HEX.clear()
        found = _HEX[number] = f"{number:032x}"
    return found


def session_uuid(session_id: str) -> UUID:
    return _uuid5(f"session/{session_id}")


def conversation_uuid(session_id: str, conversation_id: int) -> UUID:
    return _uuid5(f"session/{session_id}/conversation/{conversation_id}")


def task_uuid(session_id: str, task_id: int) -> UUID:
    return _uuid5(f"session/{session_id}/task/{task_id}")


#: The largest id or position any backend can store (a signed 64-bit column).
MAX_ID = 2**63 - 1


def invalid_argument(what: str, value: object, rule: str) -> InvalidArgumentError:
    """The one wording of an argument error: "<what> must be <rule>, got <value> (<type>)"."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidArgumentError(f"{what} must be {rule}, got {shown} ({type(value).__name__})")


def check_id(value: object, what: str) -> int:
    """An entry, conversation, task or input id: an ``int`` (never a bool, float or str) from
    1 to 2**63 - 1. Returns it; raises ``InvalidArgumentError`` naming ``what`` otherwise.
    A well-formed id that does not exist is not an error here (lookups answer None)."""
    if type(value) is int and 0 < value <= MAX_ID:
        return value
    raise invalid_argument(what, value, f"an integer id from 1 to {MAX_ID}")


_COLLECTIONS = frozenset({list, tuple, set, frozenset})


def check_ids(values: object, what: str) -> list[int]:
    """A collection of ids (a list, tuple, set or other iterable; never a str, bytes or
    mapping), each as ``check_id``; returns them as a new list."""
    # The exact built-in collections first: the ABC checks below cost ~0.5-1 us (they run
    # on every command that creates a task or appends to a context).
    ids: list[Any]
    if type(values) in _COLLECTIONS:
        ids = list(values)  # type: ignore[call-overload]  # (no typing.cast: a call a check)
    elif isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise invalid_argument(what, values, "a list, tuple or set of integer ids")
    else:
        ids = list(values)
    for i, value in enumerate(ids):
        if not (type(value) is int and 0 < value <= MAX_ID):
            raise invalid_argument(f"{what}[{i}]", value, f"an integer id from 1 to {MAX_ID}")
    return ids


def check_optional_id(value: object, what: str) -> int | None:
    return None if value is None else check_id(value, what)


def check_position(value: object, what: str) -> int:
    """A sequence position or cursor (``as_of``, ``after``, ``before``, a page cursor): an
    ``int`` from 0 (before the first commit) to 2**63 - 1."""
    if type(value) is int and 0 <= value <= MAX_ID:
        return value
    raise invalid_argument(what, value, f"an integer position from 0 to {MAX_ID}")


def check_optional_position(value: object, what: str) -> int | None:
    return None if value is None else check_position(value, what)


def check_limit(value: object, what: str = "limit", *, maximum: int) -> int:
    """A page size: an ``int`` (never a bool or float) from 1 to ``maximum``."""
    if type(value) is int and 1 <= value <= maximum:
        return value
    raise invalid_argument(what, value, f"an integer from 1 to {maximum}")


def check_choice(value: object, what: str, choices: tuple[str, ...]) -> str:
    """A mode argument: one of ``choices`` (exact strings)."""
    if type(value) is str and value in choices:
        return value
    raise invalid_argument(what, value, "one of " + ", ".join(repr(c) for c in choices))
