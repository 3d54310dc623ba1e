"""Where the bytes of the 2,000-turn workload go (issue 18: database + WAL within 1.5x of
the plain-sqlite3 floor's database, which stores the same events and read-model rows).

Runs the turns workload (``benchmarks.turns_bench``) on SQLite, checkpoints the WAL, then
reports: the files; every table and index by pages and payload (SQLite's ``dbstat``); the
event bodies by topic; and what each candidate saving is worth, counted in the stored
bytes themselves (the timestamp's transcoder wrapper, JSON-in-JSON escapes, the topic and
stream-id columns, the read-model columns that repeat an event's text). The floor runs in
the same process tree for its database size.

    python -m benchmarks.bytes_bench                 # 2,000 turns
    python -m benchmarks.bytes_bench --turns 300

A diagnostic: nothing in it changes what pico stores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.turns_bench import run
from pico.infrastructure.sql.bodies import decode

FLOOR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "floor_turns.py"
#: The transcoder's timestamp wrapper around the ISO text, as every body spells it.
STAMP_OPEN = b'{"_type_":"datetime_iso","_data_":'


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def _floor_mb(turns: int) -> str:
    if not FLOOR.exists():
        return "-"
    out = subprocess.run(
        [sys.executable, str(FLOOR), str(turns), "NORMAL"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # The floor prints its size rounded to 0.1 MB: shown to the same precision.
    return f"{json.loads(out)['db_mb'] * 1e6 / 2**20:.1f}"


def report(db: Path, turns: int) -> str:
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    files = {p.name: p.stat().st_size for p in db.parent.iterdir() if p.is_file()}
    lines = [
        f"{turns:,} faux turns (two tools each), SQLite, process durability",
        "",
        "| file | MiB |",
        "|---|---|",
        *(f"| {name} | {_mib(size)} |" for name, size in sorted(files.items())),
        f"| plain-sqlite3 floor's database, same turns | {_floor_mb(turns)} |",
        "",
        "| table or index | MiB in pages | payload MiB | rows |",
        "|---|---|---|---|",
    ]
    tables = {
        name for (name,) in con.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
    }
    for name, size, payload in con.execute(
        "SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name ORDER BY 2 DESC"
    ):
        if size < 64 * 1024:
            continue
        rows = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] if name in tables else ""
        lines.append(f"| {name} | {_mib(size)} | {_mib(payload)} | {rows} |")
    lines += ["", "| event topic | events | body MiB | mean body bytes |", "|---|---|---|---|"]
    for topic, n, body in con.execute(
        "SELECT p.topic, count(*), sum(length(e.state)) FROM pico_events e "
        "JOIN pico_topics p ON p.id = e.topic_id GROUP BY p.topic ORDER BY 3 DESC"
    ):
        if n >= turns // 10:
            lines.append(f"| {topic.rsplit(':', 1)[-1]} | {n:,} | {_mib(body)} | {body / n:.0f} |")
    n, bodies = con.execute("SELECT count(*), sum(length(state)) FROM pico_events").fetchone()
    # What the session id would hold as text in every row (numbered since revision 0008).
    sessions = con.execute(
        "SELECT sum(length(n.session_id)) FROM pico_events e "
        "JOIN pico_session_numbers n ON n.id = e.session_number"
    ).fetchone()[0]
    # What the numbered columns (revision 0008) would hold as text: the topic and stream id.
    topics, oids = con.execute(
        "SELECT sum(length(p.topic)), sum(length(s.originator_id)) FROM pico_events e "
        "JOIN pico_topics p ON p.id = e.topic_id JOIN pico_streams s ON s.id = e.stream_id"
    ).fetchone()
    stamp = escapes = plain = 0
    for (stored,) in con.execute("SELECT state FROM pico_events"):
        body = decode(bytes(stored))  # the JSON (stored deflated from revision 0007)
        plain += len(body)
        # Each wrapper's opening and its closing brace.
        stamp += body.count(STAMP_OPEN) * (len(STAMP_OPEN) + 1)
        escapes += body.count(b"\\")
    entry_text = con.execute("SELECT sum(length(content)) FROM pico_entries").fetchone()[0]
    task_state = con.execute("SELECT sum(length(state)) FROM pico_tasks").fetchone()[0]
    lines += [
        "",
        f"Events: {n:,}, bodies {_mib(bodies)} MiB as stored ({_mib(plain)} MiB of JSON before "
        "the body codec). Candidate savings (the first two counted in the JSON, inside the "
        "deflated bodies; the rest in the stored columns, before any index):",
        "",
        "| what | MiB |",
        "|---|---|",
        f"| timestamp wrapper (`{STAMP_OPEN.decode()}...}}` around the ISO text) | {_mib(stamp)} |",
        f"| backslashes in bodies, at most what JSON-in-JSON costs (state, content, metadata "
        f"as strings; text's own escapes stay) | {_mib(escapes)} |",
        f"| topic as text in every row (numbered since revision 0008) | {_mib(topics)} |",
        f"| stream id as 32 hex characters in every row (numbered since revision 0008) | "
        f"{_mib(oids)} |",
        f"| session id as text in every row (numbered since revision 0008) | {_mib(sessions)} |",
        f"| entry text in pico_entries (also in its event; deflated since 0008) | "
        f"{_mib(entry_text)} |",
        f"| task state in pico_tasks (also in its events; deflated since 0008) | "
        f"{_mib(task_state)} |",
    ]
    con.close()
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2000)
    args = ap.parse_args()
    db = Path(tempfile.mkdtemp(prefix="pico-bytes-")) / "turns.db"
    asyncio.run(run(f"sqlite:///{db}", args.turns, 16))
    print(report(db, args.turns))


if __name__ == "__main__":
    main()
