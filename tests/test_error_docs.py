"""The guide's error tables stay true: every error class the public API exports is listed
there, and every name the tables list is one the API exports."""

from __future__ import annotations

import re
from pathlib import Path

import pico

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def _exported_errors() -> set[str]:
    return {
        name
        for name in pico.__all__
        if isinstance(getattr(pico, name), type) and issubclass(getattr(pico, name), pico.PicoError)
    }


def _errors_section() -> str:
    text = GUIDE.read_text()
    start = text.index("## Errors\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_guide_lists_every_exported_error_class() -> None:
    listed = set(re.findall(r"`(\w+Error)`", _errors_section()))
    # PicoError itself is the base, named in the section's first sentence.
    missing = _exported_errors() - listed - {"PicoError"}
    assert not missing, f"docs/guide.md's Errors section does not mention {sorted(missing)}"


def test_every_error_the_guide_lists_is_exported() -> None:
    listed = set(re.findall(r"`(\w+Error)`", _errors_section()))
    unknown = listed - _exported_errors()
    assert "PicoError" in _errors_section()
    assert not unknown, f"docs/guide.md names errors pico does not export: {sorted(unknown)}"
