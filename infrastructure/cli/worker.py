"""``pico worker``: claim sessions with work on a PostgreSQL database, drive them under
leases, execute their inbox commands, release them when idle (docs/workers.md). Runs
until SIGINT or SIGTERM, then closes every held session (each release advertises its
remaining work, so another worker picks it up at once)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from typing import Annotated, Any

import typer

from pico.application.lease import Lease
from pico.domain.errors import InvalidArgumentError
from pico.infrastructure.cli.common import UrlArgument, UrlOption, location
from pico.infrastructure.settings import mask_url
from pico.infrastructure.sql.work import open_worker

__all__ = ["load_setup", "register", "run_worker"]


def load_setup(spec: str | None) -> dict[str, Any]:
    """``module:attribute``: a dict of ``Harness.open`` options, or a callable returning
    one (called once, with no arguments). None: no options (no model provider: only
    durable tasks, jobs and schedules run; an inbox input is answered with an error)."""
    if spec is None:
        return {}
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidArgumentError(
            f"--setup must be module:attribute (e.g. myapp.agents:worker_options), got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(
            f"--setup {spec!r}: module {module_name!r} cannot be imported ({exc}); is it on "
            "PYTHONPATH?"
        ) from exc
    target = getattr(module, attribute, None)
    if target is None:
        raise InvalidArgumentError(f"--setup {spec!r}: {module_name} has no {attribute!r}")
    options = target() if callable(target) else target
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise InvalidArgumentError(
            f"--setup {spec!r} must give a dict of Harness.open options (provider=, tools=, "
            f"...), got {type(options).__name__}"
        )
    return options


async def run_worker(
    url: str,
    *,
    concurrency: int,
    lease: Lease,
    idle_after: float,
    poll_every: float,
    prefix: str,
    permits: tuple[str, ...],
    options: dict[str, Any],
) -> None:
    worker = open_worker(
        url,
        concurrency=concurrency,
        lease=lease,
        idle_after=idle_after,
        poll_every=poll_every,
        permits=permits,
        prefix=prefix,
        **options,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, worker.stop)
    typer.echo(
        f"pico worker {worker.owner} on {mask_url(url)}: up to {concurrency} sessions"
        + (f" starting with {prefix!r}" if prefix else ""),
        err=True,
    )
    await worker.run()
    typer.echo(
        f"pico worker {worker.owner} stopped: {worker.picked} sessions taken, every held one "
        "released",
        err=True,
    )


def _worker(
    url: UrlArgument = None,
    url_option: UrlOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Sessions held at once.")
    ] = 8,
    setup: Annotated[
        str | None,
        typer.Option(
            "--setup",
            metavar="MODULE:ATTR",
            help="Harness.open options for every session: a dict, or a function returning "
            "one (provider=, tools=, hooks=, ...).",
        ),
    ] = None,
    prefix: Annotated[
        str, typer.Option("--prefix", help="Only sessions whose id starts with this.")
    ] = "",
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", help="Seconds a lease lasts after each renewal.")
    ] = 10.0,
    renew_every: Annotated[
        float, typer.Option("--renew-every", help="Seconds between renewals (< ttl/2).")
    ] = 3.0,
    idle_after: Annotated[
        float,
        typer.Option("--idle-after", help="Release a session after this many idle seconds."),
    ] = 2.0,
    poll_every: Annotated[
        float,
        typer.Option("--poll-every", help="Look for work at least this often (seconds)."),
    ] = 2.0,
    permit: Annotated[
        list[str] | None,
        typer.Option("--permit", help="A permit the drives grant (repeatable)."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Log every session taken and released.")
    ] = False,
) -> None:
    """Drive sessions with work on PostgreSQL: many workers share one database, each
    session has one owner at a time (a lease), a dead worker's sessions move on."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(
        run_worker(
            location(url, url_option),
            concurrency=concurrency,
            lease=Lease(ttl=lease_ttl, renew_every=renew_every),
            idle_after=idle_after,
            poll_every=poll_every,
            prefix=prefix,
            permits=tuple(permit or ()),
            options=load_setup(setup),
        )
    )


def register(app: typer.Typer) -> None:
    app.command("worker")(_worker)
