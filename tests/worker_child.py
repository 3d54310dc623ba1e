"""The session options of the crash campaign's worker processes
(tests/integration/test_worker_crash.py, benchmarks/takeover_bench.py):
``python -m pico worker URL --setup tests.worker_child:options``.

Every session runs one agent turn: the model (a faux provider answering from the request,
so one provider serves many sessions) calls ``safe`` (``replay="safe"``, sleeps) and then
``never`` (``replay="never"``, ``sequential``: it starts after ``safe`` settled), whose
every invocation is recorded with ``fsync`` in an append-only file BEFORE it sleeps; then
it answers. Each step appends a marker line ``<step> <pid> <session> <call> <token>`` to
``$PICO_CRASH_DIR/marks.log`` so a test can kill a worker at that step, and every text a
worker writes names its pid, so a test can tell which owner wrote it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pico
from pico.application.model import Request, Response, StreamEvent, ToolResultPart

__all__ = ["MARKS", "NEVER", "TurnProvider", "mark", "options", "read_lines"]

#: The marker file (one line per step reached) and the never-tool's effect file.
MARKS = "marks.log"
NEVER = "never.log"
PARAMETERS: pico.JsonObject = {
    "type": "object",
    "properties": {"session": {"type": "string"}, "token": {"type": "string"}},
}


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _append(path: Path, line: str, *, sync: bool) -> None:
    """One line, appended with O_APPEND (a single write: lines never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def mark(directory: Path, step: str, session: str, call: str = "-", token: str = "-") -> None:
    _append(directory / MARKS, f"{step} {os.getpid()} {session} {call} {token}", sync=False)


def read_lines(path: Path) -> list[list[str]]:
    """The split lines of a marker or effect file (empty when absent)."""
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def _session_of(request: Request) -> str:
    """The session named by the turn's input (``"work <session>"``)."""
    for message in request.messages:
        words = message.text.split()
        if message.role == "user" and len(words) == 2 and words[0] == "work":
            return words[1]
    return "?"


class TurnProvider:
    """A model for many sessions at once: a request with no tool results yet calls the
    tools, one after them answers. Each generation sleeps ``gen_sleep`` seconds before it
    streams (a window to die in)."""

    def __init__(self, directory: Path, gen_sleep: float) -> None:
        self.directory = directory
        self.gen_sleep = gen_sleep

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        session = _session_of(request)
        answered = any(
            isinstance(part, ToolResultPart) for m in request.messages for part in m.parts
        )
        step = "gen2" if answered else "gen1"
        mark(self.directory, step, session)
        await asyncio.sleep(self.gen_sleep)
        if answered:
            item: pico.FauxResponse | str = f"done {session} by pid {os.getpid()}"
        else:
            token = uuid.uuid4().hex[:12]  # unique per generation: call ids repeat
            args: pico.JsonObject = {"session": session, "token": token}
            item = pico.FauxResponse(tool_calls=[("safe", args), ("never", args)])
        async for event in pico.FauxProvider([item]).stream(request):
            yield event

    async def poll(self, handle: str) -> Response | pico.Deferred:
        raise pico.ProviderError(f"no deferred responses here ({handle})", kind="fatal")


def options() -> dict[str, Any]:
    """``Harness.open`` options for every session of a crash-campaign worker."""
    directory = Path(os.environ["PICO_CRASH_DIR"])
    safe_sleep = _seconds("PICO_CRASH_SAFE_SLEEP", 0.4)
    never_sleep = _seconds("PICO_CRASH_NEVER_SLEEP", 0.8)

    async def safe(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        mark(directory, "safe", str(args["session"]), ctx.call_id, str(args["token"]))
        await asyncio.sleep(safe_sleep)
        return f"safe by pid {os.getpid()}"

    async def never(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        session, token = str(args["session"]), str(args["token"])
        # The external effect: recorded durably before anything else happens.
        _append(directory / NEVER, f"{session} {ctx.call_id} {token} {os.getpid()}", sync=True)
        mark(directory, "never", session, ctx.call_id, token)
        await asyncio.sleep(never_sleep)
        return f"never by pid {os.getpid()}"

    return {
        "provider": TurnProvider(directory, _seconds("PICO_CRASH_GEN_SLEEP", 0.3)),
        "tools": [
            pico.Tool("safe", "Idempotent work", PARAMETERS, safe, replay="safe"),
            pico.Tool("never", "A side effect", PARAMETERS, never, replay="never", sequential=True),
        ],
    }


def worker_argv(
    url: str,
    prefix: str,
    *,
    poll_every: float,
    ttl: float | None = None,
    renew_every: float | None = None,
    idle_after: float = 0.5,
    concurrency: int = 8,
    setup: str = "tests.worker_child:options",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The command line of a real ``pico worker`` process with these options (the crash
    campaign's, the takeover and the worker benchmarks'); a lease option left None is
    the command's default."""
    lease = [] if ttl is None else ["--lease-ttl", str(ttl)]
    if renew_every is not None:
        lease += ["--renew-every", str(renew_every)]
    return [
        sys.executable,
        "-m",
        "pico",
        "worker",
        url,
        "--setup",
        setup,
        "--prefix",
        prefix,
        *lease,
        "--idle-after",
        str(idle_after),
        "--poll-every",
        str(poll_every),
        "--concurrency",
        str(concurrency),
        *extra,
    ]
