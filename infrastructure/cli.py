"""The ``pico`` command line: a demo session, transcripts, the audit log, verification.

python -m pico demo  [--db demo.db] [--force]
python -m pico show  --url sqlite:///demo.db [--session main]
python -m pico audit --url sqlite:///demo.db [--session main] [--after N] [--limit N]
python -m pico check sqlite:///demo.db [--session main]

The reading commands take any storage URL: ``sqlite:///demo.db``, ``postgresql://...`` or a
JSONL store's directory (``jsonl:///sessions``, four slashes before an absolute path); a
JSONL read takes no lock and writes nothing, so it runs beside the session's owner.

No command deletes or rewrites a file it was not asked to create (``demo --force`` is the
one explicit exception); every error is one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pico._version import package_version
from pico.application.clock import FakeClock
from pico.application.conversation import ConversationHandle
from pico.application.faux import FauxProvider, FauxResponse
from pico.application.harness import Harness
from pico.application.ports import AuditRecord
from pico.application.tools import Tool, ToolContext
from pico.domain.errors import InvalidArgumentError, PicoError
from pico.domain.json import JsonObject, JsonValue

__all__ = ["AUDIT_PAGE", "audit_records", "build_parser", "main"]

#: Events read per page while ``audit`` streams: memory stays flat for any log length.
AUDIT_PAGE = 1000

#: The demo's default file; taken names get a number (``pico-demo-2.db``) instead.
DEMO_DB = Path("pico-demo.db")


def _text(content: JsonValue) -> str:
    """A readable one-line rendering: message text, tool calls, tool results."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        parts = []
        text = content.get("text", content.get("content"))
        if isinstance(text, str) and text:
            parts.append(text.replace("\n", " | ")[:160])
        calls = content.get("tool_calls")
        if isinstance(calls, list) and calls:
            rendered = [
                f"{c.get('name')}({json.dumps(c.get('arguments'))})"
                for c in calls
                if isinstance(c, dict)
            ]
            parts.append("-> " + ", ".join(rendered))
        if content.get("is_error") is True:
            parts.append("(error)")
        if parts:
            return " ".join(parts)
    return json.dumps(content)


async def print_conversation(h: Harness, conv: ConversationHandle, out: list[str]) -> None:
    snap = await conv.snapshot()
    origin = (
        f" (fork of {snap.source.conversation_id} after commit {snap.source.as_of})"
        if snap.source
        else ""
    )
    out.append(f"conversation {conv.id}{origin}")
    out.append("  transcript:")
    after: int | None = None
    while True:
        page = await conv.entries(after=after, limit=200)
        for e in page.items:
            own = "" if e.conversation_id == conv.id else f"  [from {e.conversation_id}]"
            out.append(f"    {e.id:>4} {e.kind:<9} {_text(e.content)}{own}")
        if page.next is None:
            break
        after = page.next
    out.append(f"  context (revision {snap.prefix_revision}):")
    for e in await conv.context_entries():
        out.append(f"    {e.id:>4} {e.kind:<9} {_text(e.content)}")


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
    decides whether ``db`` may be replaced (``_clear_demo_files``)."""
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
    events = sum(1 for _ in audit_records(h))
    out.append(f"session head {h.head()}, {events} events in the audit log")
    out.append(f"read it again: python -m pico show --url {url} (or audit, check)")
    await h.close()
    return "\n".join(out)


async def show(url: str, session: str) -> str:
    out: list[str] = []
    async with await Harness.open(url, session=session, read_only=True) as h:
        after: int | None = None
        while True:
            page = await h.conversations(after=after, limit=100)
            for snap in page.items:
                await print_conversation(h, ConversationHandle(h, snap.id), out)
                out.append("")
            if page.next is None:
                break
            after = page.next
    return "\n".join(out)


def audit_records(h: Harness, *, after: int = 0, page: int = AUDIT_PAGE) -> Iterator[AuditRecord]:
    """Every stored event after position ``after``, read page by page (constant memory)."""
    while True:
        records = h.audit(after=after, limit=page)
        yield from records
        if len(records) < page:
            return
        after = records[-1].position


def _audit_line(r: AuditRecord) -> str:
    return json.dumps(
        {
            "position": r.position,
            "at": r.timestamp.isoformat() if r.timestamp else "-",
            "aggregate": r.aggregate,
            "version": r.version,
            "event": r.event,
            "payload": r.payload,
        },
        ensure_ascii=False,
    )


async def audit(
    url: str,
    session: str,
    *,
    after: int = 0,
    limit: int | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    page: int = AUDIT_PAGE,
) -> int:
    """Print the session's events after ``after`` as JSON lines, as they are read. With a
    ``limit``, print at most that many and say on ``err`` how many remain and where to
    page on. Returns the number of events printed."""
    out = out or sys.stdout
    err = err or sys.stderr
    printed = 0
    async with await Harness.open(url, session=session, read_only=True) as h:
        last = after
        for r in audit_records(
            h, after=after, page=page if limit is None else min(page, limit + 1)
        ):
            if limit is not None and printed == limit:
                remaining = h.audit_count(after=last)
                noun = "event remains" if remaining == 1 else "events remain"
                print(
                    f"pico: printed {printed} event{'' if printed == 1 else 's'} "
                    f"(--limit {limit}); {remaining} more {noun}: continue with --after {last}",
                    file=err,
                )
                break
            out.write(_audit_line(r) + "\n")
            printed += 1
            last = r.position
        out.flush()
    return printed


def _free_demo_path() -> Path:
    """``pico-demo.db`` or, when taken, the first free ``pico-demo-N.db``: running the demo
    twice never touches an earlier run's file."""
    n = 1
    while True:
        path = DEMO_DB if n == 1 else DEMO_DB.with_name(f"{DEMO_DB.stem}-{n}{DEMO_DB.suffix}")
        if not any(Path(f"{path}{s}").exists() for s in ("", "-wal", "-shm")):
            return path
        n += 1


def _demo_path(db: Path | None, force: bool) -> Path:
    """Where the demo may write: refuses an existing file unless ``force`` (then removes it
    and its WAL companions so the demo starts from nothing)."""
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


async def check(url: str, session: str, out: TextIO | None = None) -> int:
    """Verify a session (``pico.check``) and print each finding on its own line."""
    from pico.infrastructure.verify import check as verify

    out = out or sys.stdout
    report = await verify(url, session=session)
    for finding in report.findings:
        out.write(f"{finding}\n")
    summary = "clean" if report.ok else f"{len(report.findings)} finding(s)"
    skipped = "".join(f"; skipped: {s}" for s in report.skipped)
    out.write(f"session {session!r}: {report.events} events checked, {summary}{skipped}\n")
    out.flush()
    return 0 if report.ok else 1


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _position(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (its default adds the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: plain-text help, every option explained."""
    parser = _Parser(
        prog="pico",
        description="pico: a durable, event-sourced agent harness. Run a demo session, read "
        "transcripts and the event log of a session, or verify a stored session.",
        epilog="Set PICO_DEBUG=1 to see the traceback of an unexpected error.",
    )
    parser.add_argument(
        "--version", action="version", version=f"pico {package_version()}", help="print the version"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (see COMMAND --help)"
    )
    p_demo = sub.add_parser(
        "demo",
        help="run the demo agent session on a SQLite file",
        description="Run a demo agent session (faux model, two tools, an abort, a reopen) on "
        "a SQLite file and print its transcript. Never replaces an existing file unless "
        "--force is given.",
    )
    p_demo.add_argument(
        "--db",
        type=Path,
        default=None,
        help=f"the SQLite file to create (default: {DEMO_DB}, or {DEMO_DB.stem}-2{DEMO_DB.suffix} "
        "and so on when taken)",
    )
    p_demo.add_argument(
        "--force",
        action="store_true",
        help="replace the --db file (and its -wal/-shm) if it exists",
    )
    reads = (
        ("show", "print every conversation's transcript and context"),
        ("audit", "print the session's stored events as JSON lines, in order"),
    )
    for name, text in reads:
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _add_location(p)
        if name == "audit":
            p.add_argument(
                "--after",
                type=_position,
                default=0,
                help="print events after this position (default: 0, from the start)",
            )
            p.add_argument(
                "--limit",
                type=_positive,
                default=None,
                help="print at most this many events and say how to page on (default: all)",
            )
    p_check = sub.add_parser(
        "check",
        help="verify a stored session: integrity, events, read model",
        description="Verify a stored session without writing: the SQLite integrity check "
        "(every line of a JSONL journal parses), every event decodes, versions are "
        "contiguous, batches end with their boundary, and the read model equals a replay of "
        "the events. Exit code 0: clean; 1: findings, one per line; 2: the check could not "
        "run.",
    )
    _add_location(p_check)
    return parser


def _add_location(p: argparse.ArgumentParser) -> None:
    """Where the session is, the same for every reading command: the URL as the first
    argument (``pico audit sqlite:///x.db``) or as ``--url``."""
    p.add_argument(
        "url",
        nargs="?",
        default=None,
        help="the storage URL, e.g. sqlite:///pico-demo.db or jsonl:///sessions",
    )
    p.add_argument(
        "--url", dest="url_option", metavar="URL", default=None, help="the same, as an option"
    )
    p.add_argument("--session", default="main", help="the session name (default: main)")
    p.set_defaults(location_parser=p)


def _location(args: argparse.Namespace) -> None:
    p: argparse.ArgumentParser = args.location_parser
    if args.url is not None and args.url_option is not None:
        p.error("give the storage URL once: as the first argument or as --url, not both")
    args.url = args.url if args.url is not None else args.url_option
    if args.url is None:
        p.error("the storage URL is required, e.g. sqlite:///pico-demo.db")


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        print(asyncio.run(demo(_demo_path(args.db, args.force))))
        return 0
    if args.command == "show":
        print(asyncio.run(show(args.url, args.session)))
        return 0
    if args.command == "audit":
        asyncio.run(audit(args.url, args.session, after=args.after, limit=args.limit))
        return 0
    return asyncio.run(check(args.url, args.session))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "demo":
        _location(args)
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader went away (`pico audit ... | head -1`): as the Python docs recommend,
        # point stdout at devnull so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # the shell's code for a process ended by SIGPIPE
    except KeyboardInterrupt:
        return 130
    except PicoError as exc:
        print(f"pico: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("PICO_DEBUG"):
            raise
        print(
            f"pico: unexpected {type(exc).__name__}: {_one_line(str(exc))} "
            "(run with PICO_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 2


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"
