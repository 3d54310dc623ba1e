"""The aggregates' stream ids: ``domain/ids.py`` derives them with its own uuid5 (the
standard library's without its per-call overhead), which must give the very UUIDs the
standard ``uuid.uuid5`` gives: every stored event names its stream by them."""

from __future__ import annotations

import pickle
import uuid

import pytest

from pico.domain import ids

NAMES = ["s", "", "a session/with/slashes", "sessión ünïcode 字", "x" * 500, "\x00"]


@pytest.mark.parametrize("session_id", NAMES)
def test_stream_ids_are_the_standard_uuid5(session_id: str) -> None:
    ns = ids._NS
    for n in (1, 2, 7, 12345, 2**53 - 1):
        expected = uuid.uuid5(ns, f"session/{session_id}/task/{n}")
        got = ids.task_uuid(session_id, n)
        assert got == expected and got.int == expected.int
        assert str(got) == str(expected) and got.bytes == expected.bytes
        assert hash(got) == hash(expected) and got.version == 5
        assert got.variant == uuid.RFC_4122 and got.is_safe is uuid.SafeUUID.unknown
        assert pickle.loads(pickle.dumps(got)) == expected
        conv = ids.conversation_uuid(session_id, n)
        assert conv == uuid.uuid5(ns, f"session/{session_id}/conversation/{n}")
    assert ids.session_uuid(session_id) == uuid.uuid5(ns, f"session/{session_id}")


def test_a_name_that_is_not_valid_unicode_is_refused_as_uuid5_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        uuid.uuid5(ids._NS, "session/\ud800")
    with pytest.raises(UnicodeEncodeError):
        ids.session_uuid("\ud800")


def test_stream_hex_is_the_uuids_hex_for_either_form_and_its_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ids, "_HEX", {})
    monkeypatch.setattr(ids, "_HEX_LIMIT", 3)
    streams = [uuid.uuid4() for _ in range(7)] + [uuid.UUID(int=5), uuid.UUID(int=2**128 - 1)]
    for oid in streams:
        assert ids.stream_hex(oid) == oid.hex
        assert ids.stream_hex(str(oid)) == oid.hex  # as read back from storage
        assert ids.stream_hex(oid.hex) == oid.hex
        assert len(ids._HEX) <= 3
