"""The JSONL backend across real processes: a worker running prompts, plain commands and
working writes SIGKILLed at seeded random points (both durability modes), and two
processes contending for one session's write lock."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import pico
from tests.processes import ROOT

SESSION = "crash"
FRAMES = pico.working_list("app.frames", str, scope=pico.working_scope("frames"))

#: Imports pico once, then forks one worker per "run <start> <crash> <k>" line read from
#: stdin, so a round costs a fork, not an interpreter start. Each worker writes one JSON
#: line per result its call returned (one os.write each: atomic on a pipe), starting with
#: its pid; the zygote reports the worker's exit status once it is reaped. ``crash`` forces
#: the worker's own SIGKILL at an exact point of its k-th journal write: ``half-main``
#: after writing half of a main line (a torn tail), ``after-sidecar`` between a working
#: batch's sidecar line and its main line; ``random`` leaves the kill to the parent.
ZYGOTE = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    import pico
    from pico.infrastructure.jsonl.journal import Journal

    def arm(crash, k):
        writes = [0]

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        if crash == "half-main":
            real = Journal._write

            def write(self, path, data, *, new=False):
                if path == self.main:
                    writes[0] += 1
                    if writes[0] == k:
                        real(self, path, data[: len(data) // 2], new=new)
                        die()
                real(self, path, data, new=new)

            Journal._write = write
        elif crash == "after-sidecar":
            real_working = Journal.append_working

            def append_working(self, path, batch, scope):
                real_working(self, path, batch, scope)
                writes[0] += 1
                if writes[0] == k:
                    die()

            Journal.append_working = append_working

    def say(record):
        os.write(1, (json.dumps(record) + "\\n").encode())

    async def work(url, durability, n):
        provider = pico.FauxProvider([f"answer {k}" for k in range(n, n + 100000)])
        h = await pico.Harness.open(
            url, session="crash", provider=provider, durability=durability
        )
        c = await h.root()
        scope = pico.working_scope("frames")
        frames = pico.working_list("app.frames", str, scope=scope)
        while True:
            kind = n % 8
            if kind in (0, 3, 6):
                input_id, result = await c.prompt(f"question {n}")
                entry = await h.entry(result.entry_id)
                say({"n": n, "prompt": input_id, "status": result.status,
                     "entry": result.entry_id, "content": entry.content})
            elif kind in (1, 4):
                entry_id = await c.append("user", {"n": n})
                say({"n": n, "append": entry_id, "content": {"n": n}})
            elif kind in (2, 5):
                await h.command(scope, lambda tx: tx.append_list(frames, f"frame {n}"))
                say({"n": n, "frame": f"frame {n}"})
            else:
                await h.command(lambda tx: tx.retire_working_scope(scope))
                say({"n": n, "retired": True})
            n += 1

    url, durability = sys.argv[1], sys.argv[2]
    for line in sys.stdin:
        _, start, crash, k = line.split()
        start, k = int(start), int(k)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                arm(crash, k)
                say({"pid": os.getpid()})
                asyncio.run(work(url, durability, start))
            finally:
                os._exit(70)
        _, status = os.waitpid(pid, 0)
        say({"reaped": status})
    """
)


def _lines_parse(path: Path) -> list[bytes]:
    """Every line of a journal file is complete and parses; the file ends with a newline."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path} ends with a half line"
    lines = data.splitlines()
    for line in lines:
        json.loads(line)
    return lines


class Campaign:
    """What the workers acknowledged, checked against every reopen."""

    def __init__(self, directory: Path) -> None:
        self.url = f"jsonl:///{directory}"
        self.directory = directory
        self.prompts: dict[int, tuple[int, Any]] = {}  # input -> (entry, content)
        self.appends: dict[int, Any] = {}  # entry -> content
        self.frames: list[str] = []  # the working list's expected contents
        self.next = 0  # the n the next worker starts at

    def acknowledge(self, record: dict[str, Any]) -> None:
        if "prompt" in record:
            assert record["status"] == "done", record
            self.prompts[record["prompt"]] = (record["entry"], record["content"])
        elif "append" in record:
            self.appends[record["append"]] = record["content"]
        elif "frame" in record:
            self.frames.append(record["frame"])
        else:
            self.frames = []
        self.next = record["n"] + 1

    async def check(self) -> None:
        """Reopen: every acknowledged result present, the in-flight command whole or
        absent, the files all complete lines."""
        h = await pico.Harness.open(self.url, session=SESSION, provider=pico.FauxProvider([]))
        try:
            c = await h.root()
            for input_id, (entry_id, content) in self.prompts.items():
                result = await c.result(input_id)
                assert result is not None and result.status == "done", (input_id, result)
                assert result.entry_id == entry_id
                entry = await h.entry(entry_id)
                assert entry is not None and entry.content == content
            for entry_id, content in self.appends.items():
                entry = await h.entry(entry_id)
                assert entry is not None and entry.content == content, entry_id
            frames = [i.value for i in (await h.read_list(FRAMES, limit=1000)).items]
            inflight = self.next  # the command the kill may have interrupted
            if inflight % 8 in (2, 5) and frames == [*self.frames, f"frame {inflight}"]:
                self.frames = frames  # durable, reply lost: whole
            elif inflight % 8 == 7 and frames == []:
                self.frames = []
            assert frames == self.frames, (inflight, frames, self.frames)
            # Check: after reopen no half batch is left in any file.
            _lines_parse(self.directory / f"{SESSION}.jsonl")
            scopes = self.directory / f"{SESSION}.scopes"
            for sidecar in sorted(scopes.iterdir()) if scopes.is_dir() else []:
                _lines_parse(sidecar)
        finally:
            await h.close()


@pytest.mark.parametrize("durability", ["process", "fsync"])
async def test_a_worker_killed_at_random_points_loses_no_returned_result(
    tmp_path: Path, durability: str
) -> None:
    rng = random.Random(f"jsonl-kill-{durability}")
    campaign = Campaign(tmp_path / "j")
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, campaign.url, durability],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    stdin, stdout = zygote.stdin, zygote.stdout

    def read() -> dict[str, Any]:
        line = stdout.readline()
        assert line, "the zygote died"
        record: dict[str, Any] = json.loads(line)
        return record

    kills: dict[str, int] = {}
    try:
        for _ in range(15):
            crash = rng.choice(["random", "random", "half-main", "after-sidecar"])
            k = rng.randint(1, 10)
            stdin.write(f"run {campaign.next} {crash} {k}\n")
            stdin.flush()
            record = await asyncio.to_thread(read)
            if crash == "random":
                for _ in range(k):
                    campaign.acknowledge(await asyncio.to_thread(read))
                time.sleep(rng.uniform(0, 0.02))  # somewhere inside a later command
                os.kill(record["pid"], signal.SIGKILL)
            while "reaped" not in (record := await asyncio.to_thread(read)):
                campaign.acknowledge(record)  # returned before the signal landed
            assert os.WIFSIGNALED(record["reaped"]), record
            assert os.WTERMSIG(record["reaped"]) == signal.SIGKILL
            kills[crash] = kills.get(crash, 0) + 1
            main = campaign.directory / f"{SESSION}.jsonl"
            torn = not main.read_bytes().endswith(b"\n")
            if crash == "random" and torn:
                # A batch is one write(), but Linux stops a write to a file between pages
                # when a fatal signal is pending (generic_perform_write): a SIGKILL that
                # lands inside a write crossing a page boundary tears its line there, at a
                # multiple of the page size, and nowhere else. The reopen below must cut it.
                assert main.stat().st_size % os.sysconf("SC_PAGE_SIZE") == 0, main.stat()
            else:
                assert torn == (crash == "half-main"), crash
            await campaign.check()
    finally:
        stdin.close()
        zygote.wait(timeout=30)
    assert sum(kills.values()) == 15 and len(kills) == 3, kills
    assert campaign.prompts and campaign.appends
    # Check: the workload continues after the last kill: a new owner drives to idle (any
    # interrupted turn finished) and answers a new prompt.
    provider = pico.FauxProvider([f"resumed {k}" for k in range(20)])
    h = await pico.Harness.open(campaign.url, session=SESSION, provider=provider)
    c = await h.root()
    assert await asyncio.wait_for(h.drive(), timeout=30) == "idle"
    _, result = await c.prompt("one more")
    assert result is not None and result.status == "done"
    await h.close()
    await campaign.check()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import pico

    async def main(url):
        h = await pico.Harness.open(url, session="held")
        entry = await (await h.root()).append("user", "written by the holder")
        print(entry, flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # hold the lock until told
        await h.close()

    asyncio.run(main(sys.argv[1]))
    """
)


def _files(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("ending", ["exits", "is killed"])
async def test_a_second_writer_process_is_refused_until_the_first_is_gone(
    tmp_path: Path, ending: str
) -> None:
    directory = tmp_path / "j"
    url = f"jsonl:///{directory}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), timeout=60)
        entry = int(line)
        files = _files(directory)
        # Check: the second writer is refused before it writes anything.
        with pytest.raises(pico.SessionLockedError, match="open for writing in another process"):
            await pico.Harness.open(url, session="held")
        assert _files(directory) == files
        # Check: reading only works meanwhile, takes no lock and writes nothing.
        h = await pico.Harness.open(url, session="held", read_only=True)
        assert [e.id for e in (await (await h.root()).entries()).items] == [entry]
        await h.close()
        assert _files(directory) == files
        if ending == "exits":
            holder.stdin.write("done\n")
            holder.stdin.flush()
            assert holder.wait(timeout=30) == 0
        else:
            os.kill(holder.pid, signal.SIGKILL)
            assert holder.wait(timeout=30) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    # Check: once the holder is gone (even by a kill: the kernel drops its flock) the
    # next writer gets in and continues the journal.
    h = await pico.Harness.open(url, session="held")
    c = await h.root()
    after = await c.append("user", "the next owner")
    assert [e.id for e in (await c.entries()).items] == [entry, after]
    await h.close()


async def test_a_forked_child_does_not_keep_the_writers_lock_after_the_writer_closes(
    tmp_path: Path,
) -> None:
    """An ``flock`` belongs to the open file, which a fork shares with the child: a child
    that kept its copy would hold the session's lock after its parent closed (a
    multiprocessing pool forked from a process with a harness open). The child closes its
    copies at the fork, and the handle it inherited writes nothing."""
    url = f"jsonl:///{tmp_path / 'j'}"
    h = await pico.Harness.open(url, session="forked")
    await (await h.root()).append("user", "before the fork")
    release, held = os.pipe()
    report, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: tries its inherited handle's write path, then waits
        try:
            os.close(held)
            os.close(report)
            store: Any = h._line.storage.recorder.store  # type: ignore[attr-defined]
            try:
                store.write([], [], [])
                verdict = b"wrote"
            except pico.StorageUnavailableError:
                verdict = b"refused"
            except Exception:
                verdict = b"other"
            os.write(told, verdict)
            os.read(release, 1)  # alive, with everything it inherited, until released
        finally:
            os._exit(0)
    os.close(release)
    os.close(told)
    try:
        assert os.read(report, 16) == b"refused"
        await h.close()
        # The child still lives; the lock is free all the same.
        again = await pico.Harness.open(url, session="forked")
        c = await again.root()
        await c.append("user", "after")
        assert [e.content for e in (await c.entries()).items] == ["before the fork", "after"]
        await again.close()
    finally:
        os.write(held, b"x")
        os.close(held)
        os.close(report)
        os.waitpid(pid, 0)


async def test_a_session_name_too_long_for_its_file_names_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    """A JSONL session's files are named after it, percent-encoded: 28 CJK characters pass
    the 200-character name check but make a file name past the file system's 255 bytes.
    The open says so (not "check the permissions") and creates nothing."""
    directory = tmp_path / "j"
    name = "会话" * 14
    with pytest.raises(pico.ConfigurationError, match="too long for a JSONL store"):
        await pico.Harness.open(f"jsonl:///{directory}", session=name)
    assert not directory.exists()
    h = await pico.Harness.open(f"jsonl:///{directory}", session=name[:20])  # one that fits
    await h.close()


async def test_a_working_scope_name_too_long_for_a_file_name_is_kept_under_its_hash(
    tmp_path: Path,
) -> None:
    """A working scope's lifetime is a sidecar file named after the scope: a name too long
    for a file name is stored under its hash (the file's lines name the scope), so the
    scope works as on every other backend, and a reopen reads it back."""
    url = f"jsonl:///{tmp_path / 'j'}"
    scope = pico.working_scope("s" * 240)
    frames = pico.working_list("app.frames", str, scope=scope)
    h = await pico.Harness.open(url, session="long")
    await h.command(scope, lambda tx: tx.append_list(frames, "one"))
    await h.command(scope, lambda tx: tx.append_list(frames, "two"))
    await h.close()
    (sidecar,) = (tmp_path / "j" / "long.scopes").iterdir()
    assert sidecar.name.startswith("%%") and len(sidecar.name) < 255
    h = await pico.Harness.open(url, session="long")
    page = await h.read_list(frames)
    assert [e.value for e in page.items] == ["one", "two"]
    await h.close()
