"""Every ```python block in README.md and docs/ runs (STYLE 12), in a scratch directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

BLOCKS = [
    (path, i, code) for path in DOCS for i, code in enumerate(BLOCK.findall(path.read_text()))
]
CASES = [pytest.param(path, i, code, id=f"{path.name}:{i}") for path, i, code in BLOCKS]


@pytest.mark.parametrize(("path", "index", "code"), CASES)
def test_doc_block_runs(path: Path, index: int, code: str, tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__doc_example__"})
    finally:
        os.chdir(cwd)


def test_docs_have_examples() -> None:
    assert len(CASES) >= 3


def test_doc_blocks_pass_mypy_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example type-checks as a user's own module would: ``mypy --strict`` with the
    project's configuration, one invocation over all blocks (each its own module)."""
    from mypy import api

    monkeypatch.chdir(ROOT)  # the config's mypy_path and cache are relative to the cwd

    files = []
    for path, index, code in BLOCKS:
        module = tmp_path / f"{path.stem.lower().replace('-', '_')}_example_{index}.py"
        module.write_text(code)
        files.append(str(module))
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--follow-imports=silent",  # the library itself is checked by the main mypy run
            "--no-error-summary",
            *files,
        ]
    )
    assert status == 0, f"{stdout}{stderr}".replace(str(tmp_path) + os.sep, "")
