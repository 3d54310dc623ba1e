"""Routine live-task reads never walk terminal history (§7, §10.3), checked on SQLite by
the work the database does: VM steps stay flat while terminal history grows tenfold."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pico
from pico.domain.state import SESSION_SCOPE
from tests.taskdefs import definitions


def _steps(conn: Any, read: Any) -> int:
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        read()
    finally:
        conn.set_progress_handler(None, 1)
    return count


async def _history(h: pico.Harness, conversation_id: int, n: int) -> None:
    def build(tx: pico.Command) -> None:
        for _ in range(n):
            tid = tx.create_task(conversation_id, "job", state={"command": "true"})
            tx.patch_task(tid, status="killed")

    await h.command(build)


async def test_live_scans_of_a_conversation_stay_flat_as_its_terminal_history_grows(
    tmp_path: Path,
) -> None:
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'plans.db'}", session="plans", definitions=definitions()
    )
    c = await h.root()
    live = await h.command(
        lambda tx: tx.create_task(c.id, "job", state={"command": "x"}, foreground=True)
    )
    conn = h._line.storage.recorder.writer.connection()  # type: ignore[attr-defined]
    tasks = h._line.storage.tasks

    def scans() -> None:
        for query in (
            {"conversation_ids": [c.id], "live": True},
            {"conversation_ids": [c.id], "live": True, "foreground": True},
            {"conversation_ids": [c.id], "role": "ready"},
            {"live": True},
            {"role": "ready"},
        ):
            assert [t.id for t in tasks.scan_tasks(**query).items] == [live]

    await _history(h, c.id, 200)
    small = _steps(conn, scans)
    await _history(h, c.id, 1800)
    large = _steps(conn, scans)
    # Check: 10x the terminal history, (almost) the same work. A plan through the full
    # (conversation, id) index walks every terminal row: ~10x the steps.
    assert large < small * 1.3, (small, large)
    await h.close()


async def test_a_value_page_after_a_cursor_seeks_instead_of_walking_the_scope(
    tmp_path: Path,
) -> None:
    # Paging values resumes from a cursor (a queue scan starts at one too): the read must
    # seek to it, not walk every value of the scope that sorts before it.
    h = await pico.Harness.open(f"sqlite:///{tmp_path / 'plans.db'}", session="plans")
    conn = h._line.storage.recorder.writer.connection()  # type: ignore[attr-defined]
    state = h._line.storage.state

    async def fill(start: int, n: int) -> None:
        def build(tx: pico.Command) -> None:
            for i in range(start, start + n):
                tx.set_value(pico.SessionValue(namespace="app.before", key=f"{i:06d}"), i)

        await h.command(build)

    await fill(0, 200)
    await h.set_value(pico.SessionValue(namespace="app.wanted", key="k"), 1)

    def page() -> None:
        found = state.scan_values(SESSION_SCOPE, after=("app.before", "~"), limit=10)
        assert [item.namespace for item in found.items] == ["app.wanted"]

    small = _steps(conn, page)
    await fill(200, 1800)
    large = _steps(conn, page)
    # Check: 10x the values before the cursor, (almost) the same work; the OR form of the
    # cursor condition walked them all (~10x).
    assert large < small * 1.3, (small, large)
    await h.close()


async def test_an_append_finds_the_context_end_by_one_index_probe_in_a_generic_plan() -> None:
    """PostgreSQL runs a prepared statement with a generic plan after its fifth execution
    (psycopg prepares them): the query for the end of a conversation's context must probe
    the index there too, not aggregate every element (each append was O(context))."""
    import psycopg
    import psycopg.sql

    from pico.infrastructure.sql.recorder import _LAST_POSITION
    from tests.backends import require_postgres

    url = require_postgres("the generic plan of the context-end query")
    session = f"plan-{uuid.uuid4().hex[:8]}"
    async with await pico.Harness.open(url, session=session) as h:
        c = await h.root()

        def build(tx: pico.Command) -> None:
            tx.append_context(c.id, [tx.append_entry(c.id, "user", f"m{i}") for i in range(300)])

        await h.command(build)
    query = _LAST_POSITION.replace("?", "%s")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE last_position(varchar, bigint) AS {query % ('$1', '$2')}")
        explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE last_position({}, {})")
        plan = conn.execute(
            explain.format(psycopg.sql.Literal(session), psycopg.sql.Literal(c.id))
        ).fetchone()
    assert plan is not None

    def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = [node] if "Scan" in node["Node Type"] else []
        for child in node.get("Plans", []):
            found.extend(scans(child))
        return found

    (scan,) = scans(plan[0][0]["Plan"])
    # Check: one index entry read, not all 300 of the conversation's elements.
    assert scan["Actual Rows"] == 1, scan
