"""``pico audit`` on a real SQLite file: each format, the filters, the paging hint, the
progress bar only on a terminal, and every bad option as one line with exit code 2."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import pico
from pico.application.audit import AUDIT_COLUMNS, AuditEntry, audit_records
from pico.infrastructure.cli import run
from pico.infrastructure.cli.audit import Format, audit, register


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        """A group, so the command is called by its name as under ``pico``."""

    return app


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[AuditEntry]]:
    """A SQLite session written by two owners (JSON content, a fork, an agent turn), and
    its export as the Python API gives it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('audit-cli') / 'audited.db'}"

    async def build() -> list[AuditEntry]:
        async with await pico.Harness.open(url, session="main") as h:
            root = await h.root()
            first = await root.append("user", {"text": "Inspect", "n": 1}, metadata={"k": 1})
        provider = pico.FauxProvider(["The parser recurses."])
        async with await pico.Harness.open(url, session="main", provider=provider) as h:
            root = await h.root()
            fork = await root.fork(at_entry=first)
            await fork.append("user", "on the fork")
            await root.prompt("Why is it slow?")
            return list(audit_records(h))

    return url, asyncio.run(build())


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(_app(), ["audit", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


def test_jsonl_is_the_default_with_payloads_decoded_and_who_on_each_line(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    code, out, err = _invoke(url)
    assert code == 0 and err == ""
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [e.to_json() for e in entries]
    assert list(lines[0]) == list(AUDIT_COLUMNS)
    first = next(x for x in lines if x["event"] == "Conversation.EntryAppended")
    assert first["payload"]["content"] == {"text": "Inspect", "n": 1}  # JSON, not a string
    assert first["owner"] and first["host"] and isinstance(first["pid"], int)
    assert first["at"].endswith("+00:00")


def test_csv_has_fixed_columns_and_the_payload_as_json(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    code, out, _ = _invoke(url, "--format", "csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert tuple(rows[0]) == AUDIT_COLUMNS
    assert len(rows) == 1 + len(entries)
    for row, e in zip(rows[1:], entries, strict=True):
        assert int(row[0]) == e.position and row[4] == e.event and row[5] == e.owner
        assert row[8] == ("" if e.task is None else str(e.task))
        assert json.loads(row[9]) == e.payload


def test_the_table_is_for_people_and_has_one_row_per_event(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    code, out, _ = _invoke(url, "--format", "table")
    assert code == 0
    assert out.count("position") == 1  # one header, however many chunks
    # A record's first line starts with its position; wrapped payload lines do not.
    positions = [int(line[:9]) for line in out.splitlines() if line[:9].strip().isdigit()]
    assert positions == [e.position for e in entries]
    assert "Conversation.EntryAppended" in out and '"content":{"text":"Inspect"' in out


def test_filters_on_the_command_line_match_the_python_api(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    middle = entries[len(entries) // 2]
    assert middle.at is not None
    task = next(e.payload["task_id"] for e in entries if e.event == "Task.Created")
    fork = next(
        e.payload["conversation_id"]
        for e in entries
        if e.event == "Conversation.Created" and e.payload["source_conversation_id"] is not None
    )
    cases = {
        ("--event", "Session.Claimed", "--event", "Task.Created"): [
            e for e in entries if e.event in ("Session.Claimed", "Task.Created")
        ],
        ("--conversation", str(fork)): [
            e for e in entries if e.payload.get("conversation_id") == fork
        ],
        ("--task", str(task)): [
            e for e in entries if e.aggregate == f"task/{task}" or e.task == task
        ],
        ("--after", str(middle.position)): [e for e in entries if e.position > middle.position],
        ("--before", str(middle.position)): [e for e in entries if e.position < middle.position],
        ("--since", middle.at.isoformat().replace("+00:00", "Z")): [
            e for e in entries if e.at is not None and e.at >= middle.at
        ],
        ("--until", middle.at.isoformat()): [
            e for e in entries if e.at is not None and e.at < middle.at
        ],
    }
    for args, expected in cases.items():
        code, out, err = _invoke(url, *args)
        assert code == 0 and err == "", (args, err)
        assert [json.loads(line)["position"] for line in out.splitlines()] == [
            e.position for e in expected
        ], args
        assert expected, args


def test_a_filtered_limit_says_how_many_matching_events_remain(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    appended = [e for e in entries if e.event == "Conversation.EntryAppended"]
    assert len(appended) > 2
    code, out, err = _invoke(url, "--event", "Conversation.EntryAppended", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 2
    assert err.strip() == (
        f"pico: printed 2 events (--limit 2); {len(appended) - 2} more matching "
        f"event{'s remain' if len(appended) - 2 != 1 else ' remains'}: continue with --after "
        f"{appended[1].position}"
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_and_never_when_quiet_or_piped(
    session: tuple[str, list[AuditEntry]],
) -> None:
    url, entries = session
    for err, quiet, shown in (
        (_Terminal(), False, True),
        (_Terminal(), True, False),
        (io.StringIO(), False, False),
    ):
        out = io.StringIO()
        printed = asyncio.run(audit(url, "main", out=out, err=err, quiet=quiet, page=10))
        assert printed == len(entries) == len(out.getvalue().splitlines())
        assert bool(err.getvalue()) is shown, (quiet, err.getvalue())
        assert "pico audit" in err.getvalue() or not shown


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--event", "Conversation.Appended"], "Conversation.Appended"),
        (["--since", "2026-12-01T15:00"], "--since"),
        (["--until", "yesterday"], "--until"),
        (["--since", "2026-12-02T00:00Z", "--until", "2026-12-01T00:00Z"], "since"),
        (["--after", "9", "--before", "9"], "before"),
        (["--format", "xml"], "--format"),
        (["--limit", "0"], "--limit"),
        (["--conversation", "0"], "--conversation"),
        (["--before", "soon"], "--before"),
    ],
)
def test_a_bad_option_is_one_line_with_exit_code_2(
    session: tuple[str, list[AuditEntry]],
    args: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = session
    code = run(_app(), ["audit", url, *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("pico: ") and named in err, err
    assert "Traceback" not in err and "│" not in err


def test_the_in_process_audit_takes_a_format(
    session: tuple[str, list[AuditEntry]], tmp_path: Path
) -> None:
    url, entries = session
    out = io.StringIO()
    assert asyncio.run(audit(url, "main", fmt=Format.csv, out=out, err=io.StringIO())) == len(
        entries
    )
    assert out.getvalue().splitlines()[0] == ",".join(AUDIT_COLUMNS)


def test_a_session_whose_conversation_no_longer_loads_is_still_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    from pico.infrastructure.cli.app import app, run

    db = tmp_path / "damaged.db"

    async def write() -> None:
        async with await pico.Harness.open(f"sqlite:///{db}") as h:
            c = await h.root()
            await c.append("user", "first")
            await c.append("user", "second")

    asyncio.run(write())
    con = sqlite3.connect(db)
    with con:  # the root conversation's second event: its stream now has a gap
        (position,) = con.execute(
            "SELECT id FROM pico_events WHERE topic_id IN (SELECT id FROM pico_topics "
            "WHERE topic LIKE '%Conversation.EntryAppended') "
            "ORDER BY id LIMIT 1"
        ).fetchone()
        con.execute("DELETE FROM pico_events WHERE id = ?", (position,))
        (left,) = con.execute("SELECT count(*) FROM pico_events").fetchone()
    con.close()
    # Check: the conversation no longer loads, so a Harness cannot open it ...
    assert run(app, ["show", f"sqlite:///{db}"]) == 2
    capsys.readouterr()
    # ... but the auditor still reads every stored event, the gap visible by position.
    assert run(app, ["audit", f"sqlite:///{db}", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == left
    assert position not in [json.loads(line)["position"] for line in lines]
