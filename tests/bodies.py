"""Stored event bodies edited behind pico's back the way someone with database tools and
pico's codec could: decoded to JSON, edited, encoded again (``pico.infrastructure.sql.
bodies``). A tampering test that edited the stored bytes directly would edit deflate output
(SQL's ``replace()`` finds no text in it), and one that wrote plain JSON back would test
the old format only."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from pico.infrastructure.sql import bodies


def _mark(conn: Any) -> str:
    """The connection's parameter mark: a sqlite3 or a psycopg connection."""
    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


def reencoded(stored: Any, topic: str, edit: Callable[[bytes], bytes]) -> bytes:
    """The stored form of ``edit`` applied to the JSON of ``stored`` (an event of ``topic``)."""
    return bodies.encode(topic, edit(bodies.decode(bytes(stored))))


def edit_bodies(
    conn: Any, edit: Callable[[bytes], bytes], *, where: str = "1 = 1", params: Any = ()
) -> int:
    """Apply ``edit`` to the JSON of every ``pico_events`` row matching ``where`` (SQL in
    the connection's paramstyle: a sqlite3 or a psycopg connection) and store it encoded
    again. Returns how many bodies the edit changed (0: it found nothing to edit). An event
    row names its topic by number (``pico_topics``, schema revision 0008): ``where`` filters
    by topic as ``topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE ...)``."""
    mark = _mark(conn)
    rows = conn.execute(
        "SELECT id, (SELECT topic FROM pico_topics WHERE pico_topics.id = pico_events.topic_id),"
        f" state FROM pico_events WHERE {where}",
        params,
    )
    changed = 0
    for position, topic, state in rows.fetchall():
        body = bodies.decode(bytes(state))
        new = edit(body)
        if new != body:
            conn.execute(
                f"UPDATE pico_events SET state = {mark} WHERE id = {mark}",
                (bodies.encode(topic, new), position),
            )
            changed += 1
    return changed


def store_as_json(conn: Any) -> int:
    """Rewrite every event body as the JSON a pico before schema revision 0007 stored
    (for a database made to look older than this pico). Returns how many it rewrote."""
    mark = _mark(conn)
    rows = conn.execute("SELECT id, state FROM pico_events").fetchall()
    for position, state in rows:
        conn.execute(
            f"UPDATE pico_events SET state = {mark} WHERE id = {mark}",
            (bodies.decode(bytes(state)), position),
        )
    return len(rows)
