"""How pico is asked to open storage, done wrong: every mistake is a ``PicoError`` with one
sentence that names it (passwords masked), never a pydantic, psycopg or SQLAlchemy
exception, and nothing is created on disk."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pydantic
import pytest
import sqlalchemy

import pico
from tests.backends import end_backends, require_postgres

SECRET = "s3cr3t-pw"


async def _refused(url: Any, error: type[pico.PicoError], **kwargs: Any) -> pico.PicoError:
    with pytest.raises(pico.PicoError) as info:
        await pico.Harness.open(url, **kwargs)
    exc = info.value
    assert type(exc) is error or isinstance(exc, error), f"{type(exc).__name__}: {exc}"
    assert not isinstance(
        exc, pydantic.ValidationError | sqlalchemy.exc.SQLAlchemyError | psycopg.Error
    )
    message = str(exc)
    assert SECRET not in message
    assert "\n" not in message and "Traceback" not in message
    return exc


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "mysql://user@host/db",
        "pico.db",
        "sqlite://relative.db",
        "sqlite://",
        "sqlite:///",
        "sqlite:///pico.db?mode=ro",
        "jsonl://relative-dir",
        "jsonl:///",
        "jsonl:///sessions?sync=1",
        f"postgresql://user:{SECRET}@host:notaport/db",
        42,
        None,
    ],
)
async def test_a_bad_storage_url_is_a_configuration_error(
    url: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative path would land here (restored after)
    await _refused(url, pico.ConfigurationError)
    assert list(tmp_path.iterdir()) == []


async def test_a_sqlite_url_with_two_slashes_says_how_to_write_it(tmp_path: Path) -> None:
    exc = await _refused("sqlite://relative.db", pico.ConfigurationError)
    assert "sqlite:///" in str(exc) and "three slashes" in str(exc)


@pytest.mark.parametrize(
    "session",
    ["", "x" * 201, "a\x00b", "line\nbreak", "tab\there", "\ud800", "\x7f", 7, None, b"main"],
    ids=["empty", "too-long", "nul", "newline", "tab", "surrogate", "del", "int", "none", "bytes"],
)
@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
async def test_a_malformed_session_name_is_a_configuration_error(
    session: Any, scheme: str, tmp_path: Path
) -> None:
    url = "memory://" if scheme == "memory" else f"sqlite:///{tmp_path / 'pico.db'}"
    await _refused(url, pico.ConfigurationError, session=session)
    assert not (tmp_path / "pico.db").exists()


async def test_a_session_name_of_200_printable_characters_is_accepted(tmp_path: Path) -> None:
    name = "é" * 199 + "z"
    h = await pico.Harness.open(f"sqlite:///{tmp_path / 'pico.db'}", session=name)
    await (await h.root()).append("user", "hello")
    await h.close()
    h = await pico.Harness.open(f"sqlite:///{tmp_path / 'pico.db'}", session=name, read_only=True)
    assert h.head() > 0
    await h.close()


@pytest.mark.parametrize("durability", ["sometimes", "FSYNC", "", 1])
async def test_an_unknown_durability_is_a_configuration_error(
    durability: Any, tmp_path: Path
) -> None:
    exc = await _refused(
        f"sqlite:///{tmp_path / 'pico.db'}", pico.ConfigurationError, durability=durability
    )
    assert "'process'" in str(exc) and "'fsync'" in str(exc)
    assert not (tmp_path / "pico.db").exists()


def test_settings_built_from_the_environment_apply_the_same_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PICO_SESSION", "")
    with pytest.raises(pico.ConfigurationError, match="1 to 200 characters"):
        pico.PicoSettings()
    monkeypatch.setenv("PICO_SESSION", "main")
    monkeypatch.setenv("PICO_DURABILITY", "never")
    with pytest.raises(pico.ConfigurationError, match="unknown durability"):
        pico.PicoSettings()


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_directory_as_the_sqlite_path_is_unavailable_and_left_alone(
    read_only: bool, tmp_path: Path
) -> None:
    target = tmp_path / "adir"
    target.mkdir()
    exc = await _refused(f"sqlite:///{target}", pico.StorageUnavailableError, read_only=read_only)
    assert "is a directory" in str(exc) and str(target) in str(exc)
    assert list(target.iterdir()) == []


async def test_a_sqlite_path_in_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    exc = await _refused(
        f"sqlite:///{tmp_path / 'missing' / 'deeper' / 'pico.db'}", pico.StorageUnavailableError
    )
    assert "does not exist" in str(exc) and "create it first" in str(exc)
    assert list(tmp_path.iterdir()) == []


async def test_a_read_only_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    await _refused(f"sqlite:///{tmp_path / 'none.db'}", pico.UnknownSessionError, read_only=True)
    assert list(tmp_path.iterdir()) == []


async def test_a_sqlite_path_in_a_directory_that_refuses_new_files_is_unavailable(
    tmp_path: Path,
) -> None:
    # Root ignores a chmod 500 directory; /proc refuses new files even to root, so the
    # refusal is exercised however the tests run (CI runs them as root).
    if os.geteuid() == 0:
        locked = Path("/proc")
        before = sorted(p.name for p in locked.iterdir() if not p.name.isdigit())
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        before = []
    try:
        exc = await _refused(f"sqlite:///{locked / 'pico.db'}", pico.StorageUnavailableError)
        assert str(locked / "pico.db") in str(exc)
        after = sorted(p.name for p in locked.iterdir() if not p.name.isdigit())
        assert after == before
    finally:
        if locked != Path("/proc"):
            locked.chmod(0o700)


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_sqlite_file_of_another_application_is_refused_byte_identical(
    read_only: bool, tmp_path: Path
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (9.5)")
    conn.commit()
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    exc = await _refused(f"sqlite:///{path}", pico.ConfigurationError, read_only=read_only)
    assert "another application" in str(exc)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith("-shm")) in (
        ["other.db"],
        ["other.db", "other.db-wal"],
    )


def _pg_parts() -> tuple[str, int, str]:
    url = sqlalchemy.engine.make_url(require_postgres("the connection errors"))
    return url.host or "127.0.0.1", url.port or 5432, url.database or "postgres"


@pytest.mark.parametrize("read_only", [False, True])
async def test_an_unreachable_postgresql_server_is_unavailable_with_the_password_masked(
    read_only: bool,
) -> None:
    url = f"postgresql://user:{SECRET}@127.0.0.1:1/db"
    exc = await _refused(url, pico.StorageUnavailableError, read_only=read_only)
    assert "user:***@127.0.0.1:1/db" in str(exc)
    # Check: the message shows the URL as the user wrote it, not the driver's dialect URL.
    assert "postgresql://user:***@" in str(exc) and "+psycopg" not in str(exc)
    assert "server is running" in str(exc)


async def test_an_unknown_postgresql_host_is_unavailable() -> None:
    await _refused(
        f"postgresql://user:{SECRET}@no-such-host.invalid/db", pico.StorageUnavailableError
    )


@pytest.mark.parametrize("part", ["database", "user"])
async def test_a_wrong_postgresql_database_or_user_is_unavailable(part: str) -> None:
    host, port, database = _pg_parts()
    if part == "database":
        url = f"postgresql://postgres:{SECRET}@{host}:{port}/no_such_database_pico"
    else:
        url = f"postgresql://no_such_role_pico:{SECRET}@{host}:{port}/{database}"
    exc = await _refused(url, pico.StorageUnavailableError)
    assert "no_such_" in str(exc)


async def test_a_read_only_open_of_a_postgresql_database_without_pico_tables_runs_no_ddl() -> None:
    host, port, _ = _pg_parts()
    admin = psycopg.connect(
        f"host={host} port={port} dbname=postgres user=postgres", autocommit=True
    )
    try:
        admin.execute("DROP DATABASE IF EXISTS pico_empty_ro")
        admin.execute("CREATE DATABASE pico_empty_ro")
        url = f"postgresql://postgres@{host}:{port}/pico_empty_ro"
        await _refused(url, pico.UnknownSessionError, read_only=True)
        with psycopg.connect(f"host={host} port={port} dbname=pico_empty_ro user=postgres") as c:
            tables = c.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchone()
        assert tables == (0,)
    finally:
        admin.execute("DROP DATABASE IF EXISTS pico_empty_ro")
        admin.close()


async def test_a_role_that_may_not_create_pico_tables_is_told_how_to_create_them() -> None:
    host, port, _ = _pg_parts()
    admin = psycopg.connect(
        f"host={host} port={port} dbname=postgres user=postgres", autocommit=True
    )
    role = f"pico_dml_{os.getpid()}"
    try:
        admin.execute("DROP DATABASE IF EXISTS pico_no_create")
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute("CREATE DATABASE pico_no_create")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        with psycopg.connect(
            f"host={host} port={port} dbname=pico_no_create user=postgres", autocommit=True
        ) as db:
            db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        url = f"postgresql://{role}:{SECRET}@{host}:{port}/pico_no_create"
        exc = await _refused(url, pico.StorageUnavailableError)
        assert "permission denied" in str(exc) and "pico db upgrade" in str(exc)
        assert "server is running" not in str(exc)  # not a reachability problem
    finally:
        admin.execute("DROP DATABASE IF EXISTS pico_no_create")
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.close()


async def test_a_postgresql_connection_that_goes_away_is_unavailable_then_reconnects() -> None:
    url = require_postgres("the lost connection")
    h = await pico.Harness.open(url, session=f"gone-{os.getpid()}-{id(object())}")
    c = await h.root()
    await c.append("user", "before")
    storage: Any = h._line.storage
    store = storage._read_store  # the connection its reads are lent, only that one
    with pytest.raises(pico.StorageUnavailableError, match="server is running"), store.read():
        store.meta()  # a snapshot takes its connection with its first query
        end_backends([store._local.conn.info.backend_pid])  # the server ends it meanwhile
        store.meta()
    # (A connection the server ends while it waits to be lent is replaced before it is:
    # tests/integration/test_pg_lost_links.py.)
    assert [e.content for e in (await c.entries()).items] == ["before"]  # connects afresh
    await c.append("user", "after")  # the handle is still usable
    await h.close()


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_file_as_the_jsonl_directory_is_unavailable_and_left_alone(
    read_only: bool, tmp_path: Path
) -> None:
    target = tmp_path / "afile"
    target.write_bytes(b"not a directory")
    exc = await _refused(f"jsonl:///{target}", pico.StorageUnavailableError, read_only=read_only)
    assert "is a file" in str(exc) and str(target) in str(exc)
    assert target.read_bytes() == b"not a directory"


async def test_a_jsonl_store_the_os_refuses_is_unavailable_and_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permissions cannot be refused to root, so the refusal is the OS call's own error."""
    import os

    store = tmp_path / "store"
    h = await pico.Harness.open(f"jsonl:///{store}")
    await (await h.root()).append("user", "kept")
    await h.close()
    before = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    real_open = os.open

    def refusing(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    exc = await _refused(f"jsonl:///{store}", pico.StorageUnavailableError)
    assert str(store) in str(exc) and "Permission denied" in str(exc)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == before
