"""Measurement helpers shared by the §10.3 workload benchmarks (seed 003 §10.3; issue 18).

One definition of each number a benchmark reports, so two benchmarks never disagree on
what "p99" or "bytes on disk" means: a nearest-rank percentile, CPU user and system time,
peak RSS, the storage's bytes on disk split by file kind, and a Markdown table.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "CpuTimes",
    "DiskUsage",
    "cpu_times",
    "disk_usage",
    "markdown_table",
    "peak_rss_mib",
    "percentile",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least ``q`` of all samples
    at or below it (rank ``ceil(q * n)``, 1-based, in sorted order). Always a measured
    value, never an interpolation, so a p99 over 50 samples is honestly the maximum.

    Raises:
        ValueError: no samples, or ``q`` outside (0, 1].
    """
    if not values:
        raise ValueError("a percentile of no samples: measure at least one")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class CpuTimes(NamedTuple):
    """CPU seconds this process has used, in user and kernel (system) mode."""

    user: float
    system: float

    @property
    def total(self) -> float:
        return self.user + self.system

    def __sub__(self, earlier: tuple[float, ...]) -> CpuTimes:
        return CpuTimes(self.user - earlier[0], self.system - earlier[1])


def cpu_times() -> CpuTimes:
    """This process's CPU time so far (``getrusage(RUSAGE_SELF)``): subtract two readings
    to time a span; threads (SQLite's writer, if any) are included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CpuTimes(usage.ru_utime, usage.ru_stime)


def peak_rss_mib() -> float:
    """The process's peak resident set size so far, in MiB (``ru_maxrss`` is KiB on Linux).
    A high-water mark: it never goes down, so measure sizes in increasing order."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class DiskUsage:
    """Bytes on disk (file lengths, as ``ls -l`` shows them) of one storage, by kind.

    ``database`` is the main file (SQLite's ``.db``, JSONL's main journals ``S.jsonl``);
    ``wal`` and ``shm`` are SQLite's write-ahead log and its index (0 for JSONL); ``other``
    is every other sidecar: SQLite's rollback journal and job directory, JSONL's snapshot
    files, working-scope files and lock files.
    """

    database: int = 0
    wal: int = 0
    shm: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.database + self.wal + self.shm + self.other


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0


def disk_usage(path: Path) -> DiskUsage:
    """The bytes on disk of a SQLite database file (with its ``-wal``, ``-shm``,
    ``-journal`` and ``.jobs`` sidecars beside it) or of a JSONL directory. Sample it
    before closing: SQLite removes the WAL and its index on the last close. A path that
    does not exist is all zeros."""
    if path.is_dir():  # a JSONL directory: main journals, then everything else
        database = other = 0
        for p in path.rglob("*"):
            if not p.is_file():
                continue
            main = p.parent == path and p.suffix == ".jsonl" and "+" not in p.name
            if main:
                database += p.stat().st_size
            else:
                other += p.stat().st_size
        return DiskUsage(database=database, other=other)
    sidecar = path.with_name
    return DiskUsage(
        database=_size(path),
        wal=_size(sidecar(f"{path.name}-wal")),
        shm=_size(sidecar(f"{path.name}-shm")),
        other=_size(sidecar(f"{path.name}-journal")) + _size(sidecar(f"{path.name}.jobs")),
    )


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub Markdown table; cells are ``str()`` of the values, given formatted."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
