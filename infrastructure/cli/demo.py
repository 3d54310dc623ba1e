"""``pico demo``: an agent session on a SQLite file (faux provider, two tools, a steer, an
abort, a reopen), then its transcript. It never replaces a file unless ``--force``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from pico.application.clock import FakeClock
from pico.application.conversation import ConversationHandle
from pico.application.faux import FauxProvider, FauxResponse
from pico.application.harness import Harness
from pico.application.tools import Tool, ToolContext
from pico.domain.errors import InvalidArgumentError
from pico.domain.json import JsonObject
from pico.infrastructure.cli.show import print_conversation

__all__ = ["DEMO_DB", "demo", "demo_path", "register"]

#: The demo's default file; taken names get a number (``pico-demo-2.db``) instead.
DEMO_DB = Path("pico-demo.db")


def _demo_tools(files: dict[str, str], clock: FakeClock) -> list[Tool]:
    schema: JsonObject = {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }

    async def read(args: JsonObject, ctx: ToolContext) -> str:
        path = str(args["path"])
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        await clock.sleep_until(clock.now() + 0.2)  # a search that takes a moment
        hits = [
            f"{p}: {line}"
            for p, text in files.items()
            for line in text.splitlines()
            if str(args["path"]) in line
        ]
        return "\n".join(hits) or "no matches"

    return [
        Tool("read", "Read a file", schema, read, replay="safe"),
        Tool("grep", "Find lines containing a string (pass it as path)", schema, grep),
    ]


def _demo_script() -> list[Any]:
    return [
        "The parser has two problems: it recurses once per token, and it has no error recovery.",
        FauxResponse(
            text="Let me read it.",
            tool_calls=[("read", {"path": "parser.py"}), ("grep", {"path": "parse("})],
        ),
        lambda request: (
            (
                "Yes, an empty token list returns at once. "
                if "empty input" in request.messages[-1].text
                else ""
            )
            + (
                f"parse() calls itself on tokens[1:], so depth grows with input "
                f"({len(request.messages)} messages in context). Use a loop."
            )
        ),
        "I was going to explain every detail of the parser, token by token ...",
        "Error recovery: skip to the next statement boundary and record the error.",
    ]


async def demo(db: Path) -> str:
    """An agent session on SQLite with the faux provider and two tools: a plain turn, a
    tool turn, an aborted turn, a reopen that continues; then the transcript. The caller
    decides whether ``db`` may be replaced (``demo_path``)."""
    url = f"sqlite:///{db}"
    files = {"parser.py": "def parse(tokens):\n    return parse(tokens[1:])\n"}
    clock = FakeClock()
    provider = FauxProvider(_demo_script(), chunk_chars=6, cadence=0.05, clock=clock)
    out = [f"pico demo: an agent session in {db} (faux provider, tools: read, grep)", ""]

    async def drive_with_time(conv: ConversationHandle) -> str:
        driving = asyncio.ensure_future(conv.drive())
        while not driving.done():
            await asyncio.sleep(0)
            clock.advance(0.05)  # the faux stream's cadence follows this clock
        return driving.result()

    async def open_demo() -> Harness:
        return await Harness.open(
            url,
            session="main",
            provider=provider,
            tools=_demo_tools(files, clock),
            clock=clock,
            model="faux",
        )

    h = await open_demo()
    c = await h.root()
    input_id = await c.accept("Inspect the parser")
    out.append(
        f"> Inspect the parser\n  drive: {await drive_with_time(c)}; result: "
        f"{await c.result(input_id)}"
    )
    # A tool turn, with the user steering while the tools run.
    input_id = await c.accept("Explain the first problem")
    driving = asyncio.ensure_future(c.drive())
    steer_id = None
    while not driving.done():
        await asyncio.sleep(0)
        running = [
            t for t in (await h.tasks(kind="tool", live=True)).items if t.status == "running"
        ]
        if running and steer_id is None:
            steer_id = await c.steer("Also: is the fix safe for empty input?")
        clock.advance(0.05)
    out.append(
        f"> Explain the first problem (+ a steer during tool execution)\n  drive: "
        f"{driving.result()}; result: {await c.result(input_id)}; steer result: "
        f"{await c.result(steer_id) if steer_id else None}"
    )
    # An aborted turn: the abort is durable intent; the drive performs the cleanup.
    input_id = await c.accept("Explain everything in detail")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(30):
        await asyncio.sleep(0)
    clock.advance(0.05)
    await asyncio.sleep(0)
    marked = await c.abort()
    while not driving.done():
        await asyncio.sleep(0)
        clock.advance(0.05)
    out.append(
        f"> Explain everything in detail\n  aborted tasks {marked}; result: "
        f"{await c.result(input_id)}"
    )
    await h.close()
    # A new process: reopen and continue the same conversation.
    provider.requests.clear()
    h = await open_demo()
    c = await h.root()
    input_id = await c.accept("And the second problem?")
    outcome = await drive_with_time(c)
    out.append(
        f"> And the second problem? (after reopening)\n  drive: {outcome}; result: "
        f"{await c.result(input_id)}"
    )
    out.append("")
    await print_conversation(h, c, out)
    tasks = await h.tasks(limit=100)
    out.append("")
    out.append("tasks: " + ", ".join(f"{t.id} {t.kind} {t.status}" for t in tasks.items))
    out.append(f"session head {h.head()}, {h.audit_count()} events in the audit log")
    out.append(f"read it again: python -m pico show {url} (or audit, check)")
    await h.close()
    return "\n".join(out)


def _free_demo_path() -> Path:
    """``pico-demo.db`` or, when taken, the first free ``pico-demo-N.db``: running the demo
    twice never touches an earlier run's file."""
    n = 1
    while True:
        path = DEMO_DB if n == 1 else DEMO_DB.with_name(f"{DEMO_DB.stem}-{n}{DEMO_DB.suffix}")
        if not any(Path(f"{path}{s}").exists() for s in ("", "-wal", "-shm")):
            return path
        n += 1


def demo_path(db: Path | None, force: bool) -> Path:
    """Where the demo may write: refuses an existing file (or its ``-wal``/``-shm``)
    unless ``force`` (then removes them so the demo starts from nothing)."""
    if db is None:
        return _free_demo_path()
    if db.is_dir():
        raise InvalidArgumentError(f"--db {db} is a directory; give a file path")
    taken = [p for p in (Path(f"{db}{s}") for s in ("", "-wal", "-shm")) if p.exists()]
    if taken and not force:
        raise InvalidArgumentError(
            f"{taken[0]} already exists and the demo would replace it; nothing was changed. "
            "Pass --force to replace it, or --db a new path"
        )
    for p in taken:
        p.unlink()
    return db


def _demo(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help=f"The SQLite file to create (default: {DEMO_DB}, or "
            f"{DEMO_DB.stem}-2{DEMO_DB.suffix} and so on when taken).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace the --db file (and its -wal/-shm) if it exists."),
    ] = False,
) -> None:
    """Run a demo agent session on a SQLite file and print its transcript.

    A faux model, two tools, a steer, an abort and a reopen. Never replaces an existing
    file unless --force is given."""
    print(asyncio.run(demo(demo_path(db, force))))


def register(app: typer.Typer) -> None:
    app.command("demo")(_demo)
