"""``pico serve``: the session inspector (docs/inspector.md) over HTTP with uvicorn —
read-only handles per session, loopback by default, an optional bearer token, and approval
decisions only with ``--allow-decisions``."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from pico.domain.errors import InvalidArgumentError
from pico.infrastructure.cli.common import UrlArgument, UrlOption, location
from pico.infrastructure.inspector.app import LOOPBACK_HOSTS, create_app_for_url, list_sessions
from pico.infrastructure.settings import mask_url

__all__ = ["register", "serve"]


def serve(
    url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    allow_decisions: bool = False,
    session: str | None = None,
) -> None:
    """Run the inspector for ``url`` until interrupted. ``session``, if given, must exist
    (checked before the port is bound)."""
    import uvicorn

    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"--port must be from 0 to 65535, got {port}")
    # Loopback names (and the address it binds) only: no DNS-rebinding reads.
    hosts = [*LOOPBACK_HOSTS, host] if host not in ("0.0.0.0", "::") else ["*"]
    app = create_app_for_url(url, allow_decisions=allow_decisions, token=token, allowed_hosts=hosts)
    if session is not None and session not in list_sessions(url):
        raise InvalidArgumentError(
            f"session {session!r} is not stored at {mask_url(url)}; leave out --session to "
            "pick one on the page"
        )
    shown = f"http://{host}:{port}/" + (f"?session={session}" if session else "")
    typer.echo(f"pico inspector on {shown}" + (" (token required)" if token else ""), err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _serve(
    url: UrlArgument = None,
    url_option: UrlOption = None,
    session: Annotated[
        str | None, typer.Option("--session", help="The session the page opens first.")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="The address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The port to bind.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="Require 'Authorization: Bearer TOKEN' on every API request (default: "
            "$PICO_INSPECTOR_TOKEN, if set).",
        ),
    ] = None,
    allow_decisions: Annotated[
        bool,
        typer.Option(
            "--allow-decisions",
            help="Allow granting and denying approvals (the only write; it claims the session).",
        ),
    ] = False,
) -> None:
    """Serve the session inspector: JSON, live Server-Sent Events and a web page."""
    serve(
        location(url, url_option),
        host=host,
        port=port,
        token=token or os.environ.get("PICO_INSPECTOR_TOKEN") or None,
        allow_decisions=allow_decisions,
        session=session,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(_serve)
