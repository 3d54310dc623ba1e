"""The session inspector (issue 15): a small Starlette app with JSON endpoints, a
Server-Sent Events stream of ``harness.watch`` events and a static page (docs/inspector.md).
"""

from __future__ import annotations

from pico.infrastructure.inspector.app import (
    DecisionsNotAllowedError,
    UnauthorizedError,
    create_app,
    create_app_for_url,
    list_sessions,
)

__all__ = [
    "DecisionsNotAllowedError",
    "UnauthorizedError",
    "create_app",
    "create_app_for_url",
    "list_sessions",
]
