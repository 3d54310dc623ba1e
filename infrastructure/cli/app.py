"""The ``pico`` command line: one typer app, one module per command group.

    pico demo    [--db pico-demo.db] [--force]
    pico show    URL [--session main]
    pico inspect URL [--session main]
    pico audit   URL [--session main] [filters] [--format jsonl|csv|table]
    pico verify  URL [--session main] [--start-chain]
    pico check   URL [--session main]
    pico replay  URL [--session main]
    pico rebuild URL [--session main]
    pico migrate --from URL --to URL --session S [--as NAME]
    pico db      upgrade | current | sql | history

The reading commands take any storage URL (``sqlite:///demo.db``, ``postgresql://...``,
``jsonl:///sessions``) as the first argument or as ``--url``, and open it read-only.

Every error is one line on stderr, ``pico: <what is wrong and what to do>``: exit code 2
for bad input or usage (a ``PicoError``, a typer/click usage error) and for an unexpected
error (``PICO_DEBUG=1`` shows its traceback instead); commands that find something (``check``,
``verify``, ``replay``, ``migrate``, ``db current`` off head) exit 1. No command deletes or
rewrites a file it was not asked to create (``demo --force`` is the one explicit exception).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated

import typer

from pico._version import package_version
from pico.domain.errors import PicoError
from pico.infrastructure.cli import (
    audit,
    check,
    demo,
    inspect,
    migration,
    serve,
    show,
    verify,
    worker,
)
from pico.infrastructure.cli.common import one_line
from pico.infrastructure.cli.db import register as db_commands

__all__ = ["COMMANDS", "app", "main", "run"]

app = typer.Typer(
    name="pico",
    help="pico: a durable, event-sourced agent harness. Run a demo session, read the "
    "transcripts and the event log of a stored session, or verify it.",
    epilog="Set PICO_DEBUG=1 to see the traceback of an unexpected error.",
    rich_markup_mode="markdown",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pico {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """pico: a durable, event-sourced agent harness. Run a demo session, read the
    transcripts and the event log of a stored session, or verify it."""


# ---------------------------------------------------------------- the commands, in order
# Each entry adds its command(s) to the app. The lead adds other helpers' register
# functions HERE, e.g.:
#     from pico.infrastructure.migrate import register as migrate_commands
# and appends ``migrate_commands`` to COMMANDS.
COMMANDS: list[Callable[[typer.Typer], None]] = [
    demo.register,
    show.register,
    inspect.register,
    audit.register,
    verify.register,
    check.register,
    migration.register,
    db_commands,
    serve.register,
    worker.register,
]
# ---------------------------------------------------------------- end of the commands

for _register in COMMANDS:
    _register(app)


def run(application: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``application`` on ``argv`` (default: ``sys.argv[1:]``) and return the exit code.
    Every error, typer's usage errors too, is printed as one line ``pico: ...`` on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(application)
    try:
        # click's own main() would print usage errors as a box and turn a closed pipe into
        # exit code 1; making the context ourselves leaves every outcome to the code below.
        with command.make_context("pico", args) as ctx:
            result = command.invoke(ctx)
        sys.stdout.flush()
        return result if isinstance(result, int) else 0
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # typer's usage errors: unknown option, bad value
        failed = getattr(exc, "ctx", None)
        see = f" (see {failed.command_path} --help)" if failed is not None else ""
        print(f"pico: {one_line(exc.format_message())}{see}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:
        # The reader went away (`pico audit ... | head -1`): as the Python docs recommend,
        # point stdout at devnull so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # the shell's code for a process ended by SIGPIPE
    except (KeyboardInterrupt, typer.Abort):
        return 130
    except PicoError as exc:
        print(f"pico: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("PICO_DEBUG"):
            raise
        print(
            f"pico: unexpected {type(exc).__name__}: {one_line(str(exc))} "
            "(run with PICO_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """The ``pico`` console script and ``python -m pico``."""
    return run(app, argv)
