"""A second owner always gets in (seed 000, "Claiming a run"; seed 003 §1.2).

Two real processes share one session: an owner committing (a child process driven over
pipes) and an opener (this process). Whatever the owner does meanwhile, the opener's claim
lands within a short, bounded time; the owner's next commit is refused with
``StaleWriterError``; every value the owner's commands returned before the fence is
stored, and nothing after it. The orders are forced with pipe barriers, not sleeps.

Also here: a read-only open needs no task definitions or provider to read and audit a
session with live agent tasks, and writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pico
import pico.application.line as line_module
from pico.domain.session import Session
from tests.backends import Backend

ROOT = Path(__file__).resolve().parents[2]
COUNTER = pico.session_value("owner", int)
#: The bound an opener must get in within, on any backend, under a committing owner.
BOUND = 5.0

OWNER = textwrap.dedent(
    """
    import asyncio, sys
    import pico

    COUNTER = pico.session_value("owner", int)

    async def main(url, session):
        h = await pico.Harness.open(url, session=session)
        n = 0

        async def commit():
            nonlocal n
            try:
                await h.set_value(COUNTER, n + 1)
            except pico.StaleWriterError as exc:
                print(f"fenced {n + 1} {type(exc).__name__}", flush=True)
                return False
            n += 1
            print(n, flush=True)  # only after the command returned
            return True

        print("ready", flush=True)
        for line in sys.stdin:
            word, *arg = line.split()
            if word == "commit":
                ok = True
                for _ in range(int(arg[0])):
                    ok = await commit()
                    if not ok:
                        break
                if not ok:
                    break
                print("done", flush=True)
            elif word == "loop":
                while await commit():
                    pass
                break
        await h.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


class Owner:
    """The first owner, in its own process; its output lines arrive on a queue."""

    def __init__(self, backend: Backend) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, backend.url, backend.session],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.returned: list[int] = []
        self.fenced: str | None = None
        threading.Thread(target=self._drain, daemon=True).start()
        assert self.next() == "ready"

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.strip())
        self.lines.put("<eof>")

    def next(self) -> str:
        line = self.lines.get(timeout=60)
        if line.isdigit():
            self.returned.append(int(line))
        elif line.startswith("fenced"):
            self.fenced = line
        return line

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def commit(self, k: int) -> str:
        """Commit ``k`` values; return ``done`` or the fence line."""
        self.send(f"commit {k}")
        while True:
            line = self.next()
            if line == "done" or line.startswith("fenced") or line == "<eof>":
                return line

    def wait_fenced(self) -> str:
        while self.fenced is None:
            if self.next() == "<eof>":
                break
        assert self.fenced is not None, "the first owner was never fenced"
        return self.fenced

    def finish(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def _stored_values(h: pico.Harness) -> list[int]:
    """Every value of COUNTER in the session's event log, in order."""
    out, after = [], 0
    while batch := h.audit(after=after, limit=1000):
        after = batch[-1].position
        out += [
            json.loads(str(r.payload["value"]))
            for r in batch
            if r.event == "Session.ValueSet" and r.payload.get("namespace") == "owner"
        ]
    return out


async def _open_timed(backend: Backend) -> tuple[pico.Harness, float]:
    start = time.monotonic()
    h = await backend.open()
    return h, time.monotonic() - start


@pytest.fixture
def owner(sql_backend: Backend) -> Iterator[Owner]:
    proc = Owner(sql_backend)
    yield proc
    if proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


async def test_an_opener_gets_in_while_the_owner_commits_in_a_tight_loop(
    sql_backend: Backend, owner: Owner
) -> None:
    owner.send("loop")
    while len(owner.returned) < 30:  # the owner is mid-loop
        owner.next()
    h, took = await _open_timed(sql_backend)
    assert took < BOUND, f"the second owner needed {took:.2f} s"
    fence = owner.wait_fenced()
    owner.finish()
    assert fence.endswith("StaleWriterError")
    stored = _stored_values(h)
    # Everything the owner was told is committed is stored, in order; nothing after.
    assert stored == owner.returned == list(range(1, len(owner.returned) + 1))
    assert await h.get_value(COUNTER) == owner.returned[-1]
    await h.set_value(COUNTER, -1)  # the new owner writes normally
    await h.close()


async def test_an_owner_committing_between_the_openers_read_and_its_claim_cannot_refuse_it(
    sql_backend: Backend, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert owner.commit(3) == "done"
    real_claim = line_module._claim
    seen: list[int] = []

    def claim_after_the_owner_moved(storage: Any, session: Any, *gate: Any) -> Any:
        seen.append(session.head)  # what the opener read
        assert owner.commit(5) == "done"  # the owner commits after that read
        return real_claim(storage, session, *gate)

    monkeypatch.setattr(line_module, "_claim", claim_after_the_owner_moved)
    h, took = await _open_timed(sql_backend)
    assert took < BOUND
    assert seen and h.head() > seen[0]  # the claim landed on the head it reloaded
    assert owner.commit(1).startswith("fenced 9 StaleWriterError")
    owner.finish()
    assert _stored_values(h) == owner.returned == list(range(1, 9))
    await h.close()


async def test_an_owner_whose_session_was_claimed_stores_nothing_more(
    sql_backend: Backend, owner: Owner
) -> None:
    assert owner.commit(4) == "done"
    h, took = await _open_timed(sql_backend)  # the claim lands before the owner continues
    assert took < BOUND
    head = h.head()
    assert owner.commit(3).startswith("fenced 5 StaleWriterError")
    owner.finish()
    assert h.head() == head
    assert _stored_values(h) == owner.returned == [1, 2, 3, 4]
    await h.close()


def test_a_claim_that_loses_every_race_gives_up_with_its_own_message() -> None:
    """Storage without a write lock can lose the claim; after the bounded retries the
    opener is told so (not that someone claimed its handle)."""

    class Racing:
        session_id = "s"

        def __init__(self) -> None:
            self.saves = 0

        def load(self, _id: Any) -> None:
            return None

        def save(self, _aggregates: Any, **_kw: Any) -> None:
            self.saves += 1
            raise pico.StaleWriterError("s")

    storage = Racing()
    with pytest.raises(pico.ClaimContendedError) as info:
        line_module._claim(storage, Session(session_id="s"))  # type: ignore[arg-type]
    assert storage.saves == line_module.CLAIM_ATTEMPTS
    assert "lost the claim" in str(info.value) and "since this handle opened" not in str(info.value)
    assert isinstance(info.value, pico.StaleWriterError)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_read_only_open_reads_and_audits_live_agent_work_without_definitions(
    backend: Backend, tmp_path: Path
) -> None:
    provider = pico.FauxProvider(["never asked"])
    h = await backend.open(provider=provider)
    c = await h.root()
    await c.append("user", "earlier")
    input_id = await c.accept("answer me later")
    assert any((await h.inspect()).values())  # live agent work, not driven
    await h.close()
    path = Path(backend.url[len("sqlite:///") :]) if backend.name == "sqlite" else None
    before = _sha(path) if path is not None else None

    ro = await backend.open(read_only=True)  # no provider, no definitions
    head = ro.head()
    live = await ro.inspect()
    assert any(live.values())
    entries = (await (await ro.root()).entries(limit=100)).items
    assert [e.content for e in entries][:1] == ["earlier"]
    records = ro.audit(limit=10_000)
    assert records and records[-1].position >= len(records)
    assert input_id is not None
    with pytest.raises(pico.ReadOnlyError):
        await ro.drive()
    await ro.close()
    if path is not None:
        assert _sha(path) == before  # not one byte written

    check = await backend.open(read_only=True)
    assert check.head() == head
    await check.close()
    # Driving needs the definitions: a write open without them is refused, before any claim.
    with pytest.raises(pico.TaskDefinitionError):
        await backend.open()
    check = await backend.open(read_only=True)
    assert check.head() == head
    await check.close()


async def test_a_root_written_between_the_openers_read_and_its_claim_is_not_kept_stale(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opener keeps the root conversation it decoded only when nothing committed
    before its claim landed; otherwise its first write to the root reloads it."""
    first = await sql_backend.open()
    root = await first.root()
    await root.append("user", "before the second open")
    real_claim = line_module._claim

    def claim_after_the_root_moved(storage: Any, session: Any, *gate: Any) -> Any:
        def append(tx: pico.Command) -> None:
            tx.append_context(root.id, [tx.append_entry(root.id, "user", "between")])

        first._line.run_sync(append)  # the old owner writes after the opener's read
        return real_claim(storage, session, *gate)

    monkeypatch.setattr(line_module, "_claim", claim_after_the_root_moved)
    second = await sql_backend.open()
    monkeypatch.setattr(line_module, "_claim", real_claim)
    moved = await second.root()
    await moved.append("user", "the new owner's")  # a stale root would be refused here
    texts = [e.content for e in await moved.context_entries()]
    assert texts == ["before the second open", "between", "the new owner's"]
    with pytest.raises(pico.StaleWriterError):
        await root.append("user", "the old owner is fenced")
    await second.close()
    with contextlib.suppress(pico.PicoError):
        await first.close()


async def test_a_second_opener_keeps_the_root_it_decoded_and_writes_without_reloading(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await sql_backend.open()
    await (await h.root()).append("user", "stored")
    await h.close()
    h = await sql_backend.open()
    loads: list[Any] = []
    storage = h._line.storage
    real_load = storage.load

    def counted(aggregate_id: Any) -> Any:
        loads.append(aggregate_id)
        return real_load(aggregate_id)

    monkeypatch.setattr(storage, "load", counted)
    root = await h.root()
    await root.append("user", "written")
    assert loads == []  # the open decoded the root: the first write did not replay it
    assert [e.content for e in await root.context_entries()] == ["stored", "written"]
    await h.close()
