"""PostgreSQL connections whose server ended them, and values psycopg cannot send: each is
reported as pico's error (the link's loss as ``StorageUnavailableError``, a value as
``InvalidArgumentError``), leaves nothing behind that breaks the next statement on the same
connection, and an idle connection the server ended is never lent to a command."""

from __future__ import annotations

import uuid

import pytest

import pico
from pico.infrastructure.sql import writer as sql_writer
from pico.infrastructure.sql.writer import RawWriter
from tests.backends import end_backends, require_postgres


def _url() -> str:
    return require_postgres("the lost-link tests").replace("postgresql+psycopg://", "postgresql://")


async def _open() -> pico.Harness:
    return await pico.Harness.open(_url(), session=f"lost-{uuid.uuid4().hex[:12]}")


async def test_an_idle_connection_the_server_ended_is_replaced_before_a_command_uses_it() -> None:
    h = await _open()
    c = await h.root()
    await c.append("user", "one")
    idle = h._line.storage.recorder.db.idle  # type: ignore[attr-defined]
    pids = [conn.info.backend_pid for conn in idle._stack]
    assert pids  # the commands gave their connections back
    end_backends(pids)
    await c.append("user", "two")  # not a PersistenceUncertainError: BEGIN never went out
    await c.append("user", "three")
    assert [e.content for e in (await c.entries()).items] == ["one", "two", "three"]
    await h.close()


async def test_a_write_on_a_connection_whose_server_ended_is_a_storage_error() -> None:
    h = await _open()
    writer = RawWriter(h._line.storage.recorder.db)  # type: ignore[attr-defined]
    try:
        end_backends([writer.connection().info.backend_pid])
        with pytest.raises(pico.StorageUnavailableError, match="while writing"):
            writer.transaction(lambda cur: cur.execute("SELECT %s::int", (1,)))
    finally:
        writer.close()
    await h.close()


async def test_a_read_whose_server_ended_mid_snapshot_ends_as_a_storage_error() -> None:
    h = await _open()
    await (await h.root()).append("user", "x")
    rs = h._line.storage._read_store  # type: ignore[attr-defined]
    with pytest.raises(pico.StorageUnavailableError, match="ending a read"), rs.read():
        assert rs.meta() is not None
        end_backends([rs._local.conn.info.backend_pid])
    with rs.read():
        assert rs.meta() is not None  # the next read has a live connection
    await h.close()


async def test_a_value_psycopg_cannot_send_leaves_the_connections_statements_as_they_were() -> None:
    """A statement's first use queues its PREPARE; a value that cannot be bound (text
    holding NUL) must not leave the connection's registry naming a statement its server
    never prepared, or the next use of it there would EXECUTE nothing."""
    h = await _open()
    rs = h._line.storage._read_store  # type: ignore[attr-defined]
    statement = "SELECT ?::text AS lost_link_probe"
    with pytest.raises(pico.InvalidArgumentError, match="NUL"), rs.read():
        conn = rs._local.conn
        rs._rows(statement, ("a\x00b",))
    assert all(
        "lost_link_probe" not in s for s in sql_writer._PREPARED.get(conn, {})
    )  # nothing recorded for it
    with rs.read():
        assert rs._local.conn is conn  # the same connection, lent again
        assert rs._rows(statement, ("fine",)) == [("fine",)]
    await h.close()
