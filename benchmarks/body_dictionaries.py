"""How the stored-body dictionaries of ``pico.infrastructure.sql.bodies`` were made (issue
18, bytes on disk): from the real bodies of the seed's 2,000-turn workload.

For each frequent topic, a dictionary is grown greedily from that topic's bodies: of 80
candidate bodies, the one that shrinks a sample of 300 bodies most (deflated with the
dictionary so far) is put in FRONT of it (deflate reaches the dictionary's end cheapest, so
the most useful body goes last), until no candidate saves 0.5% more or the dictionary would
outgrow the 2 KiB window (a dictionary longer than the window is cut to its last 2 KiB).
The fallback, for every other topic, is grown the same way from a sample of every topic,
and the task states of the read model (``pico_tasks.state``, pseudo-topic ``TASK_STATE``)
from that table's rows.
Both use seeded random samples, so the same database gives the same dictionaries.

    python -m benchmarks.body_dictionaries                  # runs the 2,000 turns first
    python -m benchmarks.body_dictionaries --db turns.db    # a database of the workload
    python -m benchmarks.body_dictionaries --zstd --db turns.db   # zstd dictionaries
    python -m benchmarks.body_dictionaries --zstd --spread-dates  # as revision 0010's

``--zstd`` trains a zstd dictionary (``ZSTD_SIZE`` bytes, zstd's own trainer on a seeded
sample of ``ZSTD_SAMPLE`` bodies) for every topic with at least ``OWN_SHARE`` of the
events and every read-model column (trained on the first half of its bodies), measures it
against deflate on the later half, and prints, for those zstd makes smaller, the
``ZSTD_DICTIONARIES`` entries of ``pico.infrastructure.sql.zstd_dictionaries`` (ids left
for the editor).

``--spread-dates`` (without ``--db``) runs the workload with every command's timestamp drawn
(seeded) from 2020-2045. A dictionary trained on one afternoon's bodies holds that day's
date, which bodies of another day do not match: revision 0009's dictionaries stored the
workload in 12.4 MiB on their training day and 13.1 MiB a month later. Trained on spread
dates (revision 0010) they keep only what every body shares: 12.7 MiB on any date.

Prints the ``DICTIONARIES`` entries to paste into ``bodies.py`` under NEW ids (a shipped
dictionary is never edited: a stored body names its dictionary forever), and what every
body of the database deflates to with them. A different run of the workload has other
timestamps and ids, so it prints other bytes of much the same worth.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from pico.infrastructure.sql.bodies import TASK_STATE, decode, stored_text

#: Topics with at least this share of a workload's events get a dictionary of their own.
OWN_SHARE = 0.02
WBITS = 11
LIMIT = 1 << WBITS


def _deflated(dictionary: bytes, bodies: list[bytes]) -> int:
    primed = zlib.compressobj(6, zlib.DEFLATED, -WBITS, 2, zdict=dictionary)  # as bodies.py
    total = 0
    for body in bodies:
        c = primed.copy()
        total += len(c.compress(body)) + len(c.flush())
    return total


def grow(bodies: list[bytes], seed: int = 1) -> bytes:
    """A dictionary for ``bodies``: greedy, most useful body last."""
    rnd = random.Random(seed)
    sample = rnd.sample(bodies, min(300, len(bodies)))
    candidates = rnd.sample(bodies, min(80, len(bodies)))
    dictionary = b""
    best = _deflated(dictionary, sample)
    while True:
        choice: tuple[int, bytes] | None = None
        for body in candidates:
            grown = body + dictionary
            if len(grown) > LIMIT:
                continue
            size = _deflated(grown, sample)
            if size < best * 0.995 and (choice is None or size < choice[0]):
                choice = (size, grown)
        if choice is None:
            return dictionary
        best, dictionary = choice


def _entry(topic: str | None, data: bytes, width: int = 80) -> str:
    """One ``Dictionary(...)`` of ``bodies.DICTIONARIES``, its id left for the editor."""
    text = repr(data)[2:-1]
    lines = []
    while text:
        cut = min(width, len(text))
        while text[cut - 1] == "\\" and cut < len(text):  # never split an escape
            cut += 1
        lines.append(f"        b'{text[:cut]}'")
        text = text[cut:]
    return "\n".join(
        [
            "Dictionary(",
            "    ID,",
            f"    {topic!r},",
            f"    {WBITS},",
            "    (",
            *lines,
            "    ),",
            "),",
        ]
    )


def build(db: Path) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    by_topic: dict[str, list[bytes]] = defaultdict(list)
    for topic, state in con.execute(
        "SELECT p.topic, e.state FROM pico_events e "
        "JOIN pico_topics p ON p.id = e.topic_id ORDER BY e.id"
    ):
        by_topic[topic].append(decode(bytes(state)))  # JSON, whichever form it is in
    # The read model's task states (``pico_tasks.state``, revision 0008) get one too.
    states = [stored_text(r[0]).encode() for r in con.execute("SELECT state FROM pico_tasks")]
    con.close()
    events = sum(len(bodies) for bodies in by_topic.values())
    total = sum(len(b) for bodies in by_topic.values() for b in bodies)
    own = sorted(t for t, bodies in by_topic.items() if len(bodies) >= OWN_SHARE * events)
    rnd = random.Random(2)
    mixed = [b for bodies in by_topic.values() for b in rnd.sample(bodies, min(40, len(bodies)))]
    dictionaries = {topic: grow(by_topic[topic]) for topic in own}
    fallback = grow(mixed)
    out = [f"# {len(own)} topics of their own, and the fallback (from {db.name})"]
    for topic, data in [(None, fallback), *dictionaries.items()]:
        out += [f"# {topic or 'fallback'}: {len(data)} bytes", _entry(topic, data)]
    stored = sum(
        _deflated(dictionaries.get(t, fallback), bodies) + 2 * len(bodies)
        for t, bodies in by_topic.items()
    )
    out.append(f"# bodies {total / 2**20:.2f} MiB as JSON, {stored / 2**20:.2f} MiB deflated")
    task_states = grow(states)
    out += [f"# {TASK_STATE}: {len(task_states)} bytes", _entry(TASK_STATE, task_states)]
    plain, deflated = sum(map(len, states)), _deflated(task_states, states) + 2 * len(states)
    out.append(
        f"# task states {plain / 2**20:.2f} MiB as JSON, {deflated / 2**20:.2f} MiB deflated"
    )
    return "\n".join(out)


#: The zstd dictionaries' size and training sample (``--zstd``; issue 18's sixth pass: 1, 2,
#: 3 and 4 KiB dictionaries measured, 2 KiB the smallest output).
ZSTD_SIZE = 2048
ZSTD_SAMPLE = 5000


def build_zstd(db: Path) -> str:
    import base64

    import zstandard

    from pico.infrastructure.sql.bodies import (
        DICTIONARIES,
        ENTRY_CONTENT,
        ENTRY_METADATA,
        FALLBACK,
        ZSTD_LEVEL,
        ZSTD_PARAMETERS,
    )

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    by_topic: dict[str, list[bytes]] = defaultdict(list)
    for topic, state in con.execute(
        "SELECT p.topic, e.state FROM pico_events e "
        "JOIN pico_topics p ON p.id = e.topic_id ORDER BY e.id"
    ):
        by_topic[topic].append(decode(bytes(state)))
    for (state,) in con.execute("SELECT state FROM pico_tasks ORDER BY id"):
        by_topic[TASK_STATE].append(stored_text(state).encode())
    for content, metadata in con.execute("SELECT content, metadata FROM pico_entries ORDER BY id"):
        by_topic[ENTRY_CONTENT].append(stored_text(content).encode())
        if metadata is not None:
            by_topic[ENTRY_METADATA].append(stored_text(metadata).encode())
    con.close()
    events = sum(len(b) for t, b in by_topic.items() if ":" in t)
    own = sorted(t for t, b in by_topic.items() if ":" not in t or len(b) >= OWN_SHARE * events)
    out = [f"# zstd dictionaries of {ZSTD_SIZE} bytes, level {ZSTD_LEVEL} (from {db.name})"]
    for topic in own:
        bodies = by_topic[topic]
        half = len(bodies) // 2
        sample: list[Any] = random.Random(3).sample(bodies[:half], min(ZSTD_SAMPLE, half))
        trained = zstandard.train_dictionary(ZSTD_SIZE, sample, level=ZSTD_LEVEL, threads=1)
        compressor = zstandard.ZstdCompressor(dict_data=trained, compression_params=ZSTD_PARAMETERS)
        rest = bodies[half:]
        # With the topic's newest deflate dictionary (the fallback's without one), as
        # ``bodies.encode`` deflates: a header of 2 bytes, the JSON kept when not smaller.
        ids = [d.id for d in DICTIONARIES.values() if d.codec == "deflate" and d.topic == topic]
        dictionary = DICTIONARIES[max(ids) if ids else FALLBACK].data
        deflated = sum(min(len(b), 2 + _deflated(dictionary, [b])) for b in rest)
        zstd = sum(2 + len(compressor.compress(b)) for b in rest)
        out.append(
            f"# {topic}: the later {len(rest)} bodies {deflated} bytes deflated, "
            f"{zstd} with zstd ({zstd / deflated:.3f})"
        )
        if zstd >= deflated:  # tiny values (the read model's): zstd's frame costs more
            out.append("# (not smaller: keeps its deflate dictionary)")
            continue
        data = base64.b64encode(trained.as_bytes()).decode()
        out.append(f"(ID, {topic!r}, {data!r}),")
    return "\n".join(out)


def _spread_dates(seed: int = 18) -> None:
    """Every clock reading of this process a seeded random instant of 2020-2045 (each
    command reads it once: domain/trigger.py), for training date-neutral dictionaries."""
    from datetime import UTC, datetime, timedelta

    from eventsourcing.domain import Aggregate

    rng = random.Random(seed)
    start = datetime(2020, 1, 1, tzinfo=UTC)
    span = int((datetime(2046, 1, 1, tzinfo=UTC) - start).total_seconds() * 1e6)

    def clock(cls: Any) -> datetime:
        return start + timedelta(microseconds=rng.randrange(span))

    Aggregate.Event.create_timestamp = classmethod(clock)  # type: ignore[assignment,method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", type=Path, help="a SQLite database of the workload")
    ap.add_argument("--zstd", action="store_true", help="train zstd dictionaries instead")
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument(
        "--spread-dates",
        action="store_true",
        help="stamp the workload's commands with dates spread over 2020-2045 (seeded)",
    )
    args = ap.parse_args()
    db = args.db
    if db is None:
        from benchmarks.turns_bench import run

        if args.spread_dates:
            _spread_dates()
        db = Path(tempfile.mkdtemp(prefix="pico-dictionaries-")) / "turns.db"
        asyncio.run(run(f"sqlite:///{db}", args.turns, 16))
    print(build_zstd(db) if args.zstd else build(db))


if __name__ == "__main__":
    main()
