"""Host services for jobs (§8.7; issue 14): ``PosixProcessHost`` launches OS processes
through a supervising wrapper and adopts them again after the harness died."""

from __future__ import annotations

from pico.infrastructure.host.process import PosixProcessHost

__all__ = ["PosixProcessHost"]
