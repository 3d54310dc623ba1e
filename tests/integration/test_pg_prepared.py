"""The PostgreSQL writer's statements are prepared once per connection and bound on the
client as literals (issue 16): a command's one simple-query string carries ``EXECUTE
name(literal, ...)`` calls, so the server neither parses nor plans them again. Checked
against the real server: every literal reads back as the value it was made from (with
``standard_conforming_strings`` on and off); a statement is prepared once per connection;
a failed transaction, which cannot tell which of its PREPAREs ran, forgets them and the
server's, and the next transaction prepares again and commits.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pico
from pico.infrastructure.sql import writer as sql_writer
from tests.backends import require_postgres
from tests.integration.test_pg_round_trips import _completed, _traced, _writer_conn

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.binary(max_size=64),
    st.lists(
        st.one_of(
            st.sampled_from(["'", "\\", "''", "\\'", "--", ";", "$1", "%s", "%%", "E'", "\n"]),
            st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
        ),
        max_size=8,
    ).map("".join),
)


@pytest.fixture(scope="module")
def conn() -> Any:
    import psycopg

    url = require_postgres("the prepared-statement tests")
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        yield c


@pytest.mark.parametrize("conforming", ["on", "off"])
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=VALUES)
def test_every_literal_reads_back_as_its_value(conn: Any, conforming: str, value: Any) -> None:
    conn.execute(f"SET standard_conforming_strings = {conforming}")
    literal = sql_writer._literal(value)
    assert literal is not None
    if isinstance(value, int) and not isinstance(value, bool):
        # After a minus, a negative number must not make a comment (``1--3``).
        got = conn.execute(f"SELECT 0::numeric-{literal}, ({literal})::int8").fetchone()
        assert got[0] == -value and got[1] == value
        return
    got = conn.execute(f"SELECT {literal}").fetchone()[0]
    if isinstance(value, bool) or value is None:
        assert got is value
    else:
        assert got == value and type(got) is type(value)


def test_what_psycopg_quotes_itself_is_left_to_it() -> None:
    # A NUL byte (which psycopg refuses with its own error), floats, anything else.
    assert sql_writer._literal("a\x00b") is None
    assert sql_writer._literal(1.5) is None
    assert sql_writer._literal(b"\x00\xff") == "E'\\\\x00ff'::bytea"
    assert sql_writer._literal(-3) == " -3" and sql_writer._literal(True) == "true"


async def test_a_statement_is_prepared_once_per_connection_and_executed_after() -> None:
    url = require_postgres("the prepared-statement tests")
    h = await pico.Harness.open(url, session=f"prep-{uuid.uuid4().hex[:12]}")
    c = await h.root()
    conn = _writer_conn(h)
    await c.append("user", "first")
    with _traced(conn) as second:
        await c.append("user", "it's \\ second")
    # (The open's own commands prepared most statements already.)
    done = _completed(second)
    assert "PREPARE" not in done, done
    sent = [d for w, k, d in second if w == "F" and k == "Query"]
    # One string; the single-row statements (the entry's row among them) go as EXECUTE.
    assert len(sent) == 1 and "EXECUTE pico_" in sent[0], sent
    assert "INSERT INTO pico_entries" not in sent[0], sent
    # The command's events, several rows, are one prepared multi-row INSERT too; the
    # NOTIFY names the id sequence resolved at open, not looked up by every commit.
    assert "INSERT INTO pico_events" not in sent[0], sent
    prepared = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]
    # (Each row's first value is the session's number, by subquery: rows meet at "),((".)
    assert any("INSERT INTO pico_events" in p and "),((SELECT" in p for p in prepared), prepared
    assert any("pg_notify" in p and "::regclass" in p for p in prepared), prepared
    assert not any("pg_get_serial_sequence" in p for p in prepared), prepared
    assert [e.content for e in await c.context_entries()][-2:] == ["first", "it's \\ second"]
    await h.close()


async def test_a_failed_transaction_forgets_what_it_prepared_and_the_next_prepares_again() -> None:
    url = require_postgres("the prepared-statement tests")
    h = await pico.Harness.open(url, session=f"prep-{uuid.uuid4().hex[:12]}")
    c = await h.root()
    await c.append("user", "before")
    writer = h._line.storage.recorder.writer  # type: ignore[attr-defined]
    conn = writer.connection()
    fresh = "SELECT %s::int + 0 AS fresh_statement_a"
    later = "SELECT %s::int + 0 AS fresh_statement_b"

    def fails(cur: Any) -> None:
        cur.execute(fresh, (1,))  # its PREPARE runs
        cur.execute("SELECT 1/0")
        cur.execute(later, (2,))  # its PREPARE never runs: the transaction aborted first

    with pytest.raises(Exception, match="division by zero"):
        writer.transaction(fails)
    assert conn not in sql_writer._PREPARED or not sql_writer._PREPARED[conn]
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
    seen: list[Any] = []

    def both(cur: Any) -> None:
        cur.execute(later, (2,))
        cur.execute(fresh, (1,))
        seen.append(cur.fetchone())

    writer.transaction(both)
    assert seen == [(1,)]
    await c.append("user", "after")  # the session's own statements prepare again too
    assert [e.content for e in await c.context_entries()] == ["before", "after"]
    await h.close()


def _reader(h: pico.Harness) -> Any:
    return h._line.storage._read_store  # type: ignore[attr-defined]


async def test_a_snapshot_opens_with_its_first_query_in_one_round_trip_prepared_once() -> None:
    url = require_postgres("the prepared-statement tests")
    h = await pico.Harness.open(url, session=f"prep-{uuid.uuid4().hex[:12]}")
    await (await h.root()).append("user", "x")
    rs = _reader(h)
    with rs.read():
        first_meta = rs.meta()
        conn = rs._local.conn  # lent for the snapshot; the next snapshot is lent it again
    with _traced(conn) as messages, rs.read():
        meta = rs.meta()
        again = rs.meta()
    sent = [d for w, k, d in messages if w == "F" and k == "Query"]
    # The snapshot's BEGIN travels with its first query, both EXECUTEs reuse the PREPARE
    # of the first snapshot, and the snapshot ends with its ROLLBACK.
    assert len(sent) == 3, sent
    assert "BEGIN ISOLATION LEVEL REPEATABLE READ" in sent[0] and "EXECUTE pico_" in sent[0]
    assert "PREPARE" not in "".join(sent) and "BEGIN" not in sent[1], sent
    assert "ROLLBACK" in sent[2], sent
    assert meta == again == first_meta and meta is not None and meta.head >= 1
    await h.close()


async def test_a_failed_read_forgets_what_its_connection_prepared() -> None:
    url = require_postgres("the prepared-statement tests")
    h = await pico.Harness.open(url, session=f"prep-{uuid.uuid4().hex[:12]}")
    await (await h.root()).append("user", "x")
    rs = _reader(h)
    with rs.read():
        rs.meta()
        conn = rs._local.conn
    assert sql_writer._PREPARED[conn]
    with pytest.raises(pico.PicoError), rs.read():
        rs._rows("SELECT ?::int / 0 AS prepared_then_failing", (1,))
    assert conn not in sql_writer._PREPARED
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
    with rs.read():
        assert rs.meta() is not None and rs.meta().head >= 1  # prepared again, and read
    await h.close()


async def test_a_long_in_list_is_read_with_literals_and_never_prepared() -> None:
    url = require_postgres("the prepared-statement tests")
    h = await pico.Harness.open(url, session=f"prep-{uuid.uuid4().hex[:12]}")
    c = await h.root()
    ids = [await c.append("user", f"e{i}") for i in range(sql_writer._PREPARED_PARAMS + 2)]
    rs = _reader(h)
    with rs.read():
        rs.meta()
        conn = rs._local.conn
    before = dict(sql_writer._PREPARED[conn])
    with rs.read():
        rows = rs.entry_rows(ids, content=True)
    assert sorted(rows) == sorted(ids) and rows[ids[3]].content == '"e3"'
    # The statement with more parameters than the limit was not prepared; one within it was.
    added = [s for s in sql_writer._PREPARED[conn] if s not in before]
    assert all(s.count("%s") <= sql_writer._PREPARED_PARAMS for s in added), added
    with rs.read():
        assert sorted(rs.entry_rows(ids[:2], content=False)) == sorted(ids[:2])
    assert any(s.count("%s") == 3 for s in sql_writer._PREPARED[conn] if s not in before)
    await h.close()


async def test_many_claims_on_one_connection_leave_its_prepared_statements_in_place() -> None:
    # A claim takes the session's lock through psycopg's own cursor. psycopg, left to
    # itself, prepares a statement by its sixth use on a connection and answers its next
    # ROLLBACK with DEALLOCATE ALL, which would drop pico's statements too; now that the
    # sessions of a process share their connections, one connection sees many claims.
    url = require_postgres("the prepared-statement tests")
    session = f"prep-{uuid.uuid4().hex[:12]}"
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    await c.append("user", "x")
    writer = h._line.storage.recorder.writer  # type: ignore[attr-defined]
    rs = _reader(h)
    with rs.read():
        rs.meta()
        conn = rs._local.conn
    assert conn.prepare_threshold is None
    idle = writer.db.idle
    for _ in range(8):  # each claim is lent the connection the last one gave back
        with writer.exclusive(session):
            writer.transaction(lambda cur: cur.execute("SELECT 1"))
            assert writer._fairy is None and idle._stack[-1] is conn  # given back
    for _ in range(2):  # each read ends with psycopg's ROLLBACK; the second reuses the first's
        with rs.read():
            assert rs.meta() is not None  # the snapshot's first query takes a connection
            assert rs._local.conn is conn
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] > 0
    await c.append("user", "y")
    assert [e.content for e in await c.context_entries()] == ["x", "y"]
    await h.close()
