"""Steps for the JSONL journal's crash and damage cases (§10.2): they cut or damage the
session's files the way a crash or an editor could, the one place steps reach past the
public API, because the behaviour is about damage pico did not make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import parsers, then, when

import pico
from features.steps.library import World, settles
from pico.infrastructure.jsonl.journal import Journal, file_name


@pytest.fixture
def journal_files() -> dict[str, Any]:
    """The bytes and mtimes of the journal's files as the scenario last remembered them."""
    return {}


def _journal(world: World) -> Journal:
    url = world.backend.url
    return Journal(Path(url[len("jsonl:///") :]), world.backend.session, fsync=False)


def _files(world: World) -> dict[str, tuple[bytes, int]]:
    directory = _journal(world).directory
    return {
        str(p): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@when(parsers.parse('the session stops while "{name}" is half written to "{conv}"'))
def half_written(world: World, name: str, conv: str) -> None:
    world.run(world.conv(conv).append("user", name))
    world.run(world.h.close())
    main = _journal(world).main
    data = main.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    main.write_bytes(data[: (start + len(data)) // 2])  # the crash: half the last line
    world.harness = world.run(world.backend.open(definitions=[world.work]))


@when(parsers.parse('the journal line holding "{name}" is damaged'))
def damage_line(world: World, name: str, journal_files: dict[str, Any]) -> None:
    world.run(world.h.close())
    world.harness = None
    main = _journal(world).main
    lines = main.read_bytes().splitlines(keepends=True)
    needle = f'\\"content\\":\\"\\\\\\"{name}\\\\\\"\\"'.encode()
    (at,) = [i for i, line in enumerate(lines) if needle in line]
    lines[at] = lines[at][: len(lines[at]) // 2] + b"\n"  # complete, but not JSON
    main.write_bytes(b"".join(lines))
    journal_files.update(_files(world))


@when("the session is opened again")
def opened_again(world: World) -> None:
    world.error = None
    try:
        world.harness = world.run(world.backend.open(definitions=[world.work]))
    except pico.PicoError as exc:
        world.error = exc


@then(parsers.parse("opening it for reading only is rejected as {error} too"))
def read_only_rejected(world: World, error: str) -> None:
    with pytest.raises(getattr(pico, error.strip())):
        world.run(world.backend.open(read_only=True))


@then("the journal files are unchanged")
def files_unchanged(world: World, journal_files: dict[str, Any]) -> None:
    assert _files(world) == journal_files


UNREMOVABLE = (
    '"{conv}" settles task "{scope}" with the answer "{name}" while its file cannot be removed'
)


@when(parsers.parse(UNREMOVABLE))
def settles_unremovable(
    world: World, conv: str, scope: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(journal: Journal, path: Path) -> None:
        raise OSError(f"cannot remove {path}")

    with monkeypatch.context() as patch:
        patch.setattr(Journal, "unlink", refuse)
        settles(world, conv, scope, name)
    assert _scope_files(world, scope), "the settled task's file was removed after all"


def _scope_files(world: World, scope: str) -> list[str]:
    scopes = _journal(world).scopes
    prefix = file_name(f"working/{scope}") + "."
    names = [p.name for p in scopes.iterdir()] if scopes.is_dir() else []
    return [n for n in names if n.startswith(prefix)]


@then(parsers.parse('no file of task "{scope}" is left'))
def no_file_left(world: World, scope: str) -> None:
    assert not _scope_files(world, scope)
