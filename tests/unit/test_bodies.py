"""The stored-body codec of the SQL backends (``pico.infrastructure.sql.bodies``): every
topic round-trips, JSON bodies read unchanged, a damaged body is a ``BodyFormatError``
(never a raw ``zlib.error`` or ``zstandard.ZstdError``), and the shipped dictionaries never
change."""

from __future__ import annotations

import hashlib
import json
import random
import struct
import threading
import zlib

import pytest
import zstandard
from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

from pico.domain.conversation import Conversation
from pico.domain.session import Session
from pico.domain.task import Task
from pico.infrastructure.sql import bodies
from pico.infrastructure.sql.bodies import (
    DEFLATE,
    TASK_STATE,
    ZSTD,
    BodyFormatError,
    decode,
    encode,
    encode_text,
    readable,
    stored_text,
)

#: id -> (topic, wbits, sha256 of the bytes[, codec when not deflate]). A stored body names
#: its dictionary forever: a shipped dictionary is never edited, only added under a new id.
PINNED = {
    1: (None, 11, "89c6a2c5f8f50d871b8cd6db287aff08889d894c1e86321b47c9fc7242333c74"),
    2: (
        "pico.domain.conversation:Conversation.ContextAppended",
        11,
        "6b3b551ada459273001d959bfd97ccd5181ef2b99a7cbad51152289095b4a0cb",
    ),
    3: (
        "pico.domain.conversation:Conversation.EntryAppended",
        11,
        "d41ccd092c0e34a0ad9614ddb6846102d182a04f8f6d38c4fed8cb60a8932f75",
    ),
    4: (
        "pico.domain.session:Session.Committed",
        11,
        "da84eae918c7ca0baf0ed147e83fb7ab7a90a74e776415aab7fbe181cc961b0f",
    ),
    5: (
        "pico.domain.session:Session.ValueSet",
        11,
        "a9df35b46906149583ce97b57ff5671e20f76ec09c8b2793e99b2dbf4836282d",
    ),
    6: (
        "pico.domain.session:Session.WorkingScopeRetired",
        11,
        "ab709bc9963ddb9a3e46c85c8978c5f47be3107ce9b1210ebfa3d4d9da839d43",
    ),
    7: (
        "pico.domain.task:Task.Created",
        11,
        "567bab0042ed22b1f396885fe9db03779b782cc7d80d79d5bd4ae92fbdf8f98f",
    ),
    8: (
        "pico.domain.task:Task.Patched",
        11,
        "f5bdd22c3e5c871377a25c0505480423a5c276457f55815ef1b81c088c999d28",
    ),
    9: (
        "pico_tasks.state",
        11,
        "7b20c91dce2c85e750159477850443d6d525bcc92b37809af8c6fc9d9059ad32",
    ),
    10: (
        "pico_entries.content",
        11,
        "520f879fe234b9dd04ee6d93e4bb79d8d004f949532a435fae4c086249f10d67",
    ),
    11: (
        "pico_entries.metadata",
        11,
        "388e6595a706e66dfc18eed3e4eefa7ba30177d0193e21bb293052e32b8ae48e",
    ),
    # zstd (revision 0009), trained dictionaries.
    12: (
        "pico.domain.conversation:Conversation.ContextAppended",
        0,
        "482f31d4a606ac7cc5cb7dc6d31df054ac4e860c807b4229e0a89a8c98491187",
        "zstd",
    ),
    13: (
        "pico.domain.conversation:Conversation.EntryAppended",
        0,
        "c24228a8c3d2822158bc1f0d55503a317c49240fcc4a3930a690579897a7082d",
        "zstd",
    ),
    14: (
        "pico.domain.session:Session.Committed",
        0,
        "832dc66eec2270d30331e82192c034108976c0c4060510d1fb86ba6322e41183",
        "zstd",
    ),
    15: (
        "pico.domain.session:Session.ValueSet",
        0,
        "d457e0f3d7d3140589c929736f0c04944be4487e879fc0602220464bcc1a4453",
        "zstd",
    ),
    16: (
        "pico.domain.session:Session.WorkingScopeRetired",
        0,
        "35603f2c51212a59f424392d28867a52aeaf7c061d487c5bbaa4ed2e4d405e93",
        "zstd",
    ),
    17: (
        "pico.domain.task:Task.Created",
        0,
        "cda0dc43996715b8ba945541c0975503542a3ef50f1994e8d06426101cf5dac6",
        "zstd",
    ),
    18: (
        "pico.domain.task:Task.Patched",
        0,
        "0931cfa63bc4c9f18bebd38d36dbf6dfe6b43e47f4529b18e6dc519f7e491d45",
        "zstd",
    ),
    # zstd (revision 0010), trained on bodies with timestamps spread over 2020-2045.
    19: (
        "pico.domain.conversation:Conversation.ContextAppended",
        0,
        "af5134150391a78e9d02a3c19fa91a951b9ed03015fb64a36160e62b7cbe60f1",
        "zstd",
    ),
    20: (
        "pico.domain.conversation:Conversation.EntryAppended",
        0,
        "aae0412c0fbdc91c462ef44873eb81cb93ca44f2feb19767eac3e0006e9c35e9",
        "zstd",
    ),
    21: (
        "pico.domain.session:Session.Committed",
        0,
        "9f76064a86b8da7fa570f3ef6ab926962d3862b2c007261f9c78149084078dcc",
        "zstd",
    ),
    22: (
        "pico.domain.session:Session.ValueSet",
        0,
        "3756d29e7a95b33d019a8e50aaa194b5f444a8a57d331b119d66c3f1a272c2cf",
        "zstd",
    ),
    23: (
        "pico.domain.session:Session.WorkingScopeRetired",
        0,
        "c4ebcac3fbc010de1df238567481ade7c831b715ba59e5af3e3bc95af25a431a",
        "zstd",
    ),
    24: (
        "pico.domain.task:Task.Created",
        0,
        "d66a0d3b60b1882bde1c8cafebc382e16a2e84b9560cf33d52cd6316d8795dfd",
        "zstd",
    ),
    25: (
        "pico.domain.task:Task.Patched",
        0,
        "686bcb8e0986fe3c87b54545f60a107554677b1083f0396fcb46a1b5be2f5919",
        "zstd",
    ),
}


def _topics() -> list[str]:
    """Every event type pico stores."""
    found = []
    for aggregate in (Session, Conversation, Task):
        for value in vars(aggregate).values():
            if isinstance(value, type) and issubclass(value, Aggregate.Event):
                found.append(get_topic(value))
    return found


def _body(topic: str) -> bytes:
    return json.dumps(
        {
            "timestamp": {"_type_": "datetime_iso", "_data_": "2027-02-01T09:30:00.000001+00:00"},
            "seq": 41,
            "what": topic,
            "content": json.dumps({"text": "Inspect the parser ✓"}),
        },
        separators=(",", ":"),
    ).encode()


def test_the_shipped_dictionaries_are_never_edited() -> None:
    shipped = {
        i: (d.topic, d.wbits, hashlib.sha256(d.data).hexdigest())
        + (() if d.codec == "deflate" else (d.codec,))
        for i, d in bodies.DICTIONARIES.items()
    }
    assert shipped == PINNED
    # Each deflate dictionary fits its window (deflate would use only the window's last bytes).
    deflate = [d for d in bodies.DICTIONARIES.values() if d.codec == "deflate"]
    assert len(deflate) == 11 and all(len(d.data) <= 1 << d.wbits for d in deflate)


@pytest.mark.parametrize("topic", [*_topics(), "someone.elses:Thing.Happened"])
def test_every_topic_round_trips_compressed_with_its_own_dictionary_or_the_fallback(
    topic: str,
) -> None:
    body = _body(topic)
    stored = encode(topic, body)
    used = bodies.DICTIONARIES[bodies.ENCODE_WITH.get(topic, bodies.FALLBACK)]
    assert stored[:2] == bytes((ZSTD if used.codec == "zstd" else DEFLATE, used.id))
    assert len(stored) < len(body)
    assert decode(stored) == body and readable(stored) == body
    assert encode(topic, body) == stored  # deterministic: each body starts afresh


def test_the_frequent_event_topics_encode_with_zstd_and_the_read_model_with_deflate() -> None:
    zstd = {t for t, i in bodies.ENCODE_WITH.items() if bodies.DICTIONARIES[i].codec == "zstd"}
    assert zstd == {t for t in bodies.ENCODE_WITH if ":" in t}
    assert len(zstd) == 7 and bodies.DICTIONARIES[bodies.FALLBACK].codec == "deflate"
    assert encode(TASK_STATE, b'{"inputs":[86],"tools":["read","grep"]}')[0] == DEFLATE


def test_older_bodies_still_decode_after_their_topic_moved_to_zstd() -> None:
    # What revisions 0007-0008 wrote for a topic that now encodes with zstd: deflate with
    # the topic's deflate dictionary (8), read as before.
    topic = "pico.domain.task:Task.Patched"
    body = _body(topic)
    d = bodies.DICTIONARIES[8]
    deflater = zlib.compressobj(6, zlib.DEFLATED, -d.wbits, 2, zdict=d.data)
    old = bytes((DEFLATE, 8)) + deflater.compress(body) + deflater.flush()
    assert decode(old) == body and encode(topic, body)[0] == ZSTD


def test_bodies_encode_and_decode_on_many_threads_at_once() -> None:
    # A zstd compressor or decompressor must not be shared by two threads: each thread has
    # its own, so concurrent sessions' writers and readers never corrupt each other.
    topics = [t for t in bodies.ENCODE_WITH if ":" in t]
    start = threading.Barrier(4)
    failures: list[str] = []

    def work(n: int) -> None:
        rnd = random.Random(n)
        start.wait()
        for i in range(40):
            topic = topics[(n + i) % len(topics)]
            # Tens of KB of random digits: long enough that the threads are inside zstd
            # together (it releases the GIL), which ~200-byte bodies never are.
            digits = "".join(rnd.choices("0123456789", k=50_000))
            body = _body(f"{topic} {n} {i} {digits}")
            try:
                ok = decode(encode(topic, body)) == body
            except Exception as exc:  # a shared (de)compressor's damage: BodyFormatError
                ok = False
                failures.append(f"{n}/{i}: {exc}")
            if not ok:
                failures.append(f"{n}/{i}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_the_topics_of_the_2000_turn_workload_have_dictionaries_of_their_own() -> None:
    # Every dictionary is for an event topic, but those for the read model's JSON columns
    # (task states, entry content and metadata), which no event has.
    columns = {
        topic for deflated in bodies.DEFLATED_COLUMNS.values() for topic in deflated.values()
    }
    assert columns == {bodies.TASK_STATE, bodies.ENTRY_CONTENT, bodies.ENTRY_METADATA}
    assert set(bodies.ENCODE_WITH) - columns <= set(_topics())
    assert not columns & set(_topics())
    assert [bodies.ENCODE_WITH[c] for c in sorted(columns)] == [10, 11, 9]
    assert len(bodies.ENCODE_WITH) == 10 and bodies.FALLBACK == 1


def test_a_json_body_reads_unchanged_and_one_deflate_cannot_shrink_stays_json() -> None:
    old = b'{"timestamp":{"_type_":"datetime_iso","_data_":"2026-01-01T00:00:00+00:00"}}'
    assert decode(old) is old and readable(old) == old
    assert readable(memoryview(old)) == old  # PostgreSQL's bytea may come as a buffer
    assert encode("pico.domain.task:Task.Patched", b"{}") == b"{}"


def test_a_body_rewritten_as_text_reads_as_its_utf8_bytes() -> None:
    assert readable('{"a":"ü"}') == '{"a":"ü"}'.encode()
    assert readable("\udcff") == "\udcff".encode("utf-8", "surrogatepass")


def _stored() -> bytes:
    """A deflated body (the fallback's dictionary)."""
    return encode("someone.elses:Thing.Happened", _body("pico.domain.task:Task.Patched"))


def _zstd() -> bytes:
    return encode("pico.domain.task:Task.Patched", _body("pico.domain.task:Task.Patched"))


def _huge() -> bytes:
    """A zstd body whose frame header claims 2**45 bytes of content (a damaged header): the
    one-shot decompressor would allocate that much first."""
    stored = _zstd()
    descriptor = stored[2]
    assert descriptor & 0x20  # single segment: the content size is the window
    claims = bytes(((descriptor & 0x3F) | 0xC0,)) + struct.pack("<Q", 1 << 45)
    size_bytes = {0: 1, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    return stored[:2] + claims + stored[3 + size_bytes :]


def _sizeless(body: bytes) -> bytes:
    """A magicless zstd frame of ``body`` without its content size in the header (pico
    writes every frame with it): a few hundred bytes that would expand into ``body``."""
    params = zstandard.ZstdCompressionParameters.from_level(
        1, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=0, write_checksum=0
    )
    frame: bytes = zstandard.ZstdCompressor(compression_params=params).compress(body)
    return frame


@pytest.mark.parametrize(
    ("damaged", "says"),
    [
        (_stored()[:-3], "cut short"),
        (_stored() + b"\x00\x01", "bytes after its deflate stream"),
        (bytes((DEFLATE, 200)) + _stored()[2:], "dictionary 200, which this pico does not have"),
        (bytes((DEFLATE, 3)) + b"\xff\xff\xff\xff", "does not inflate"),
        (b"\x03" + _stored()[1:], "neither JSON nor a compressed body"),
        (b"\x01", "neither JSON nor a compressed body"),
        (b"", "neither JSON nor a compressed body"),
        (_zstd()[:-3], "does not decompress|cut short"),
        (_zstd() + b"\x00\x01", "2 bytes after its zstd frame"),
        (bytes((ZSTD, 200)) + _zstd()[2:], "dictionary 200, which this pico does not have"),
        (bytes((ZSTD, 8)) + _zstd()[2:], "says zstd with dictionary 8, which is a deflate"),
        (bytes((DEFLATE, 18)) + _zstd()[2:], "says deflate with dictionary 18, which is a zstd"),
        (bytes((ZSTD, 18)) + b"\xff\xff\xff\xff", "zstd frame header is damaged"),
        (bytes((ZSTD, 18)) + _sizeless(b"0" * 1_000_000), "does not say its size"),
        (bytes((ZSTD, 18)) + b"\x20\x10" + b"\xff" * 12, "does not decompress"),
        (_huge(), "says 35184372088832 bytes, more than pico compresses"),
    ],
)
def test_a_body_that_does_not_decode_says_why_and_reads_as_its_stored_bytes(
    damaged: bytes, says: str
) -> None:
    with pytest.raises(BodyFormatError, match=says):
        decode(damaged)
    # What the recorder hands up: the bytes as stored, for the event codec to report at
    # their position like any other damaged body.
    assert readable(damaged) == damaged


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("someone.elses:Thing.Happened", "inflates to more than 1048576 bytes"),  # deflate
        ("pico.domain.task:Task.Patched", "says 2097163 bytes, more than pico compresses"),
    ],
)
def test_a_body_that_would_decompress_past_the_limit_is_refused_before_it_is_held(
    monkeypatch: pytest.MonkeyPatch, topic: str, says: str
) -> None:
    """A few KB of deflate or zstd can claim gigabytes. pico stores a body larger than
    ``MAX_DECOMPRESSED`` as JSON, so a compressed one that would decompress past it is
    damaged (or another program's): refused at the limit, without holding more, and read
    as its stored bytes like any damaged body (here with the limit lowered to 1 MiB)."""
    big = b'{"text":"' + b"0" * (2 << 20) + b'"}'
    stored = encode(topic, big)  # under the shipped limit: compressed, a few KB
    assert stored[0] in (DEFLATE, ZSTD) and len(stored) < 20_000
    monkeypatch.setattr(bodies, "MAX_DECOMPRESSED", 1 << 20)
    with pytest.raises(BodyFormatError, match=says):
        decode(stored)
    assert readable(stored) == stored
    assert stored_text(stored).startswith("<stored value is damaged")
    # And pico itself stores a body that large as it is, which reads back whole.
    assert encode(topic, big) == big
    assert decode(big) == big


@pytest.mark.parametrize(
    "state",
    [
        '{"call_id":"call_7","name":"read","arguments":{"path":"f1.py"},"offered":["read"],'
        '"truncated":false,"replay":"never","result_entry":12,"terminate":false}',
        '{"inputs":[86],"tools":["read","grep"],"model":"default","max_attempts":3}',
        "null",
        '"a plain string ✓"',
        "[1,2,3]",
    ],
)
def test_a_task_state_round_trips_deflated_when_that_is_smaller(state: str) -> None:
    stored = encode_text(TASK_STATE, state)
    assert stored_text(stored) == state
    if stored != state.encode():
        # Deflated with the task-state dictionary, smaller than its JSON.
        assert stored[:2] == bytes((DEFLATE, 9)) and len(stored) < len(state.encode())
    else:
        assert len(state.encode()) <= 20  # only a small state, with nothing to share, stays


def test_a_read_model_value_reads_whichever_codec_compressed_it() -> None:
    # pico writes the read model's values with deflate; a zstd one (a later pico's, say)
    # reads too, as every SQL reader decodes both codecs.
    text = '{"inputs":[86],"tools":["read","grep"],"model":"default","max_attempts":3}'
    zstd = encode("pico.domain.task:Task.Patched", text.encode())
    assert zstd[0] == ZSTD and stored_text(zstd) == text
    assert stored_text(encode_text(TASK_STATE, text)) == text


def test_a_task_state_stored_as_text_or_damaged_reads_as_text_that_is_no_json() -> None:
    # A row from before revision 0008 (JSON text), as SQLite returns a TEXT value.
    assert stored_text('{"inputs":[1]}') == '{"inputs":[1]}'
    assert stored_text(memoryview(b'{"inputs":[1]}')) == '{"inputs":[1]}'
    stored = encode_text(TASK_STATE, '{"inputs":[86],"tools":["read","grep"],"model":"default"}')
    for damaged in (stored[:-3], b"\xff\xfe{}", b'"caf\xe9"', bytes((DEFLATE, 200)) + stored[2:]):
        text = stored_text(damaged)  # never a UnicodeDecodeError
        assert text.startswith("<stored value is damaged (") and damaged[:4].hex() in text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


@pytest.mark.parametrize(
    ("topic", "text"),
    [
        ("pico_entries.content", '"question 12: what does the parser do with tabs?"'),
        (
            "pico_entries.content",
            '{"text":"Turn 3: let me look.","tool_calls":[{"id":"call_1","name":"read",'
            '"arguments":{"path":"f0.py"}}]}',
        ),
        ("pico_entries.metadata", '{"tool_call_id":"call_263","tool_name":"read"}'),
    ],
)
def test_an_entry_text_round_trips_deflated_with_its_column_dictionary(
    topic: str, text: str
) -> None:
    stored = encode_text(topic, text)
    assert stored[:2] == bytes((DEFLATE, bodies.ENCODE_WITH[topic]))
    assert len(stored) < len(text.encode()) and stored_text(stored) == text


#: Instants from the day revision 0009's dictionaries were trained on to decades later.
_DATES = (
    "2026-12-05T16:41:19.563420+00:00",  # the afternoon 0009's dictionaries hold
    "2026-12-05T20:10:11.123456+00:00",
    "2027-01-15T09:00:00.654321+00:00",
    "2031-07-04T18:22:33.111111+00:00",
    "2044-02-29T23:59:59.999999+00:00",
)


def _commit_bodies(date: str) -> list[bytes]:
    rng = random.Random(7)  # the same bodies but for the date
    return [
        json.dumps(
            {
                "timestamp": {"_type_": "datetime_iso", "_data_": date},
                "first": n,
                "last": n + 3,
                "scope": "main",
                "link": f"sha256:{rng.getrandbits(256):064x}",
                "task": n + 1,
            },
            separators=(",", ":"),
        ).encode()
        for n in range(20_000, 20_050)
    ]


def _mean_size(topic: str, date: str, dictionary: int | None = None) -> float:
    encoded = _commit_bodies(date)
    if dictionary is None:
        stored = [bodies.encode(topic, b) for b in encoded]
    else:
        compressor = zstandard.ZstdCompressor(
            dict_data=bodies._zstd_dictionary(bodies.DICTIONARIES[dictionary]),
            compression_params=bodies.ZSTD_PARAMETERS,
        )
        stored = [bytes((bodies.ZSTD, dictionary)) + compressor.compress(b) for b in encoded]
    assert all(bodies.decode(s) == b for s, b in zip(stored, encoded, strict=True))
    return sum(map(len, stored)) / len(stored)


def test_a_body_compresses_alike_on_any_date() -> None:
    """The encoding dictionaries hold no date (revision 0010): the same commit boundaries
    stamped on different days store within a few bytes of each other. Revision 0009's
    dictionary for them held its training afternoon: 14 bytes a body apart."""
    topic = get_topic(Session.Committed)
    assert bodies.DICTIONARIES[bodies.ENCODE_WITH[topic]].id >= 19
    sizes = [_mean_size(topic, date) for date in _DATES]
    assert max(sizes) - min(sizes) <= 4, sizes
    old = [_mean_size(topic, date, dictionary=14) for date in _DATES]
    assert max(old) - min(old) >= 10, old  # what the check above would have caught
