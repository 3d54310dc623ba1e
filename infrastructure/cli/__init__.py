"""The ``pico`` command line (``pico.infrastructure.cli:main``): a typer app in ``app.py``
and one module per command group (``demo``, ``show``, ``inspect``, ``audit``, ``verify``,
``check``, ``migration`` (replay, rebuild, migrate) and ``db``)."""

from __future__ import annotations

from pico.infrastructure.cli.app import app, main, run

__all__ = ["app", "main", "run"]
