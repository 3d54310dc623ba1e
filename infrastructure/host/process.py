"""The process host on Linux (§8.7; issue 14): ``PosixProcessHost`` implements
``pico.application.host.ProcessHost`` with a supervising wrapper per job
(``wrapper.py``), /proc for identity, pidfds to observe an exit without polling, and
bounded reads from the end of the log files for the tails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from pico.application.host import (
    ExitResult,
    LaunchIntent,
    LaunchSpec,
    ProcessIdentity,
    ProcessState,
    check_grace,
)
from pico.domain.errors import ConfigurationError, InvalidArgumentError

__all__ = ["DEFAULT_TAIL_BYTES", "PosixProcessHost"]

#: The bytes of each stream an ``ExitResult`` carries, from the end of what the log kept.
DEFAULT_TAIL_BYTES = 4096
WRAPPER = str(Path(__file__).resolve().with_name("wrapper.py"))
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot's id: a pid and start time name one process only within one boot."""
    with open(_BOOT_ID) as f:
        return f.read().strip()


def proc_stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time (field 22, clock ticks after boot) of ``pid``, or
    None when no process has that pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = text[text.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [os.fsdecode(a) for a in f.read().split(b"\0")]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _child_group(pid: int) -> int | None:
    """The process group of ``pid``'s child (the wrapper runs exactly one), or None."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = text[text.rindex(b")") + 2 :].split()
        if int(fields[1]) == pid:
            return int(fields[2])
    return None


def read_tail(path: str, end: int, size: int) -> str:
    """The last ``size`` bytes before offset ``end`` of ``path`` (never more is read),
    decoded as UTF-8; a character the cut split is dropped, not shown as a replacement."""
    start = max(0, end - size)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    except FileNotFoundError:
        return ""
    if start > 0:
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", errors="replace")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group already ended
        os.killpg(pgid, signum)


class PosixProcessHost:
    """Runs each job under ``python -I -S wrapper.py`` in a new session; the wrapper's pid,
    start time and token are the job's identity, and its status file the exit record.

    Args:
        tail_bytes: bytes of each stream kept in an ``ExitResult``'s tails.
        poll_interval: seconds between checks while waiting for a process when pidfds are
            not used (``use_pidfd=False``, or a kernel without ``pidfd_open``).
        use_pidfd: observe an exit through a pidfd (Linux 5.3+): the event loop is woken
            by the kernel when the process ends, for a child or an adopted process alike,
            and the open fd pins the process, so a recycled pid cannot be mistaken for it.
        python: the interpreter that runs the wrapper.
    """

    def __init__(
        self,
        *,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        poll_interval: float = 0.05,
        use_pidfd: bool = True,
        python: str = sys.executable,
    ) -> None:
        if not os.path.exists(_BOOT_ID):
            raise ConfigurationError(
                "the process host needs Linux's /proc (process start times and the boot id); "
                "run jobs on Linux"
            )
        if type(tail_bytes) is not int or tail_bytes < 0:
            raise InvalidArgumentError(f"tail_bytes must be an int >= 0, got {tail_bytes!r}")
        if not (isinstance(poll_interval, (int, float)) and 0 < poll_interval <= 60):
            raise InvalidArgumentError(
                f"poll_interval must be seconds in (0, 60], got {poll_interval!r}"
            )
        self.tail_bytes = tail_bytes
        self.poll_interval = float(poll_interval)
        self.use_pidfd = use_pidfd and hasattr(os, "pidfd_open")
        self.python = python
        self._boot_id = boot_id()
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def intend(self, spec: LaunchSpec, *, directory: str) -> LaunchIntent:
        if type(directory) is not str or not directory or "\x00" in directory:
            raise InvalidArgumentError(
                f"directory must be a non-empty path without NUL, got {directory!r}; pass the "
                "folder the job's logs and status file go to"
            )
        token = uuid.uuid4().hex
        base = os.path.join(os.path.abspath(directory), f"job-{token}")
        return LaunchIntent(
            token=token,
            stdout_path=f"{base}.stdout.log",
            stderr_path=f"{base}.stderr.log",
            status_path=f"{base}.status.json",
            log_cap=spec.log_cap,
        )

    def launch(self, spec: LaunchSpec, intent: LaunchIntent) -> ProcessIdentity:
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise InvalidArgumentError(
                f"cwd {spec.cwd!r} is not a directory; nothing was started; pass an existing "
                "directory or None"
            )
        os.makedirs(os.path.dirname(intent.status_path), exist_ok=True)
        created: list[str] = []
        try:
            for path in (intent.stdout_path, intent.stderr_path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                created.append(path)
        except FileExistsError:
            for path in created:
                os.unlink(path)
            raise InvalidArgumentError(
                f"launch intent {intent.token} was launched before (its log files exist); a "
                "job starts at most once: adopt it with identify() and wait(), or recover()"
            ) from None
        read_end, write_end = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    self.python,
                    "-I",
                    "-S",
                    WRAPPER,
                    intent.status_path,
                    intent.token,
                    intent.stdout_path,
                    intent.stderr_path,
                    str(intent.log_cap),
                    str(write_end),
                    "--",
                    *spec.argv,
                ],
                cwd=spec.cwd,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(write_end,),
            )
        except OSError as exc:
            os.close(read_end)
            for path in created:
                os.unlink(path)
            raise ConfigurationError(
                f"the process host could not start its wrapper with {self.python!r}: {exc}; "
                "nothing was started; check the interpreter path"
            ) from None
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as handshake:
            line = handshake.readline()
        if not line.strip().isdigit():
            proc.wait()
            for path in created:
                os.unlink(path)
            raise ConfigurationError(
                f"the process host's wrapper exited ({proc.returncode}) before starting "
                f"{spec.argv[0]!r}; nothing was started; check that {self.python!r} runs"
            )
        child = int(line)
        stat = proc_stat(proc.pid)  # our unreaped child: readable even if it already exited
        assert stat is not None
        self._children[proc.pid] = proc
        return ProcessIdentity(
            pid=proc.pid,
            # A program that could not be executed has no group of its own.
            pgid=child if child > 0 else proc.pid,
            start_ticks=stat[1],
            boot_id=self._boot_id,
            token=intent.token,
        )

    def find(self, intent: LaunchIntent) -> ProcessIdentity | None:
        """The running wrapper that carries ``intent``'s token, found through /proc: how a
        later owner adopts a process whose ``running`` command was never stored."""
        mine = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == mine:
                continue
            pid = int(name)
            args = _cmdline(pid)
            # The token (a uuid4) names the launch; the wrapper may be another install's.
            if intent.token not in args or not any(a.endswith("wrapper.py") for a in args):
                continue
            stat = proc_stat(pid)
            if stat is None or stat[0] in ("Z", "X"):
                return None  # it is ending: its status file will say how
            return ProcessIdentity(
                pid=pid,
                pgid=_child_group(pid) or pid,
                start_ticks=stat[1],
                boot_id=self._boot_id,
                token=intent.token,
            )
        return None

    def launched(self, intent: LaunchIntent) -> bool:
        """Were ``intent``'s log files created? ``launch`` creates them before starting
        anything, so False means no process of this intent can exist."""
        return os.path.exists(intent.stdout_path) or os.path.exists(intent.stderr_path)

    def identify(self, identity: ProcessIdentity) -> ProcessState:
        if identity.boot_id != self._boot_id:
            return "gone"
        stat = proc_stat(identity.pid)
        if stat is None:
            return "exited"
        state, start = stat
        if start != identity.start_ticks:
            return "gone"
        if state in ("Z", "X"):
            self._reap(identity.pid)
            return "exited"
        args = _cmdline(identity.pid)
        if identity.token in args:
            return "running"
        # An exiting process has released its memory, and with it its command line, before
        # it turns zombie; with this pid, boot and start tick it is ours, ending.
        return "exited" if args in ([], [""]) else "gone"

    def recover(self, intent: LaunchIntent, identity: ProcessIdentity | None) -> ExitResult | None:
        if identity is not None and identity.token != intent.token:
            return None
        try:
            with open(intent.status_path, "rb") as f:
                status = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(status, dict) or status.get("token") != intent.token:
            return None
        try:
            return self._result(intent, status)
        except (KeyError, TypeError, InvalidArgumentError):
            return None  # a status file this wrapper did not write whole: not an outcome

    def _result(self, intent: LaunchIntent, status: dict[str, object]) -> ExitResult:
        kept_out, kept_err = status["stdout_kept"], status["stderr_kept"]
        if type(kept_out) is not int or type(kept_err) is not int:
            raise TypeError("the kept byte counts are not ints")
        return ExitResult.from_json(  # every field checked against its type
            {
                "exit_code": status["exit_code"],
                "signal": status["signal"],
                "stdout_path": intent.stdout_path,
                "stderr_path": intent.stderr_path,
                "stdout_tail": read_tail(intent.stdout_path, kept_out, self.tail_bytes),
                "stderr_tail": read_tail(intent.stderr_path, kept_err, self.tail_bytes),
                "stdout_bytes": status["stdout_bytes"],
                "stderr_bytes": status["stderr_bytes"],
                "stdout_truncated": status["stdout_truncated"],
                "stderr_truncated": status["stderr_truncated"],
            }
        )

    async def wait(self, identity: ProcessIdentity, intent: LaunchIntent) -> ExitResult | None:
        await self._ended(identity)
        self._reap(identity.pid)
        return self.recover(intent, identity)

    async def terminate(
        self, identity: ProcessIdentity, intent: LaunchIntent, *, grace: float
    ) -> ExitResult | None:
        grace = check_grace(grace)
        if self.identify(identity) == "running" and identity.pgid != identity.pid:
            _signal_group(identity.pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._ended(identity), grace)
            except TimeoutError:
                if self.identify(identity) == "running":
                    _signal_group(identity.pgid, signal.SIGKILL)
        return await self.wait(identity, intent)

    async def _ended(self, identity: ProcessIdentity) -> None:
        """Returns once the identified process no longer runs."""
        if self.use_pidfd:
            try:
                pidfd = os.pidfd_open(identity.pid)
            except ProcessLookupError:
                return
            try:
                # Checked after opening: the fd now pins this pid to one process.
                if self.identify(identity) != "running":
                    return
                loop = asyncio.get_running_loop()
                ended = loop.create_future()

                def wake() -> None:
                    if not ended.done():
                        ended.set_result(None)

                loop.add_reader(pidfd, wake)
                try:
                    await ended
                finally:
                    loop.remove_reader(pidfd)
            finally:
                os.close(pidfd)
            return
        while self.identify(identity) == "running":
            await asyncio.sleep(self.poll_interval)

    def _reap(self, pid: int) -> None:
        proc = self._children.get(pid)
        if proc is not None and proc.poll() is not None:
            del self._children[pid]
