"""Real child processes for crash tests: a Python snippet run by this interpreter with
the repository importable, its stdout a text pipe the test reads as the child's signals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spawn_child(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` in the repository root."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
