"""The supervising wrapper of one job process (§8.7; issue 14): started by the process host
in its own session, it runs the child in its own process group, copies the child's stdout
and stderr into the log files up to the cap (then a marker; the rest is read and dropped),
forwards SIGTERM/SIGINT/SIGHUP to the child's group, and when the child has exited and its
output is drained writes the status file atomically (tmp, fsync, rename, fsync dir).

Standard library only, run by path with ``python -I -S`` (importing ``pico`` costs about
two seconds; this starts in ~20 ms). Its own lifetime is the job's: its pid, start time
and the launch token on its command line are the job's identity.

    python -I -S wrapper.py STATUS TOKEN STDOUT_LOG STDERR_LOG LOG_CAP HANDSHAKE_FD -- ARGV...
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from types import FrameType

#: After the child exited, how long output is still drained from descendants that kept
#: the pipes open (``sleep 100 &``); the job ended with its child, not with its daemons.
LINGER = 1.0
CHUNK = 65536


def marker(cap: int) -> bytes:
    return f"\n[pico: log truncated at {cap} bytes; further output was discarded]\n".encode()


class Stream:
    """One of the child's output pipes and the log file it is copied into, up to ``cap``."""

    def __init__(self, pipe: int, path: str, cap: int) -> None:
        self.pipe = pipe
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.cap = cap
        self.total = 0
        self.kept = 0
        self.truncated = False

    def take(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self.kept
        if room > 0:
            part = data[:room]
            os.write(self.fd, part)  # a regular file: writes are whole
            self.kept += len(part)
        if len(data) > room and not self.truncated:
            self.truncated = True
            os.write(self.fd, marker(self.cap))

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def write_status(path: str, status: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(status, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def main(args: list[str]) -> int:
    status_path, token, out_path, err_path, cap_text, handshake_text, sep, *argv = args
    if sep != "--" or not argv:
        print("usage: wrapper.py STATUS TOKEN OUT ERR CAP FD -- ARGV...", file=sys.stderr)
        return 2
    cap, handshake = int(cap_text), int(handshake_text)
    status: dict[str, object] = {"token": token, "exit_code": None, "signal": None}
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
        )
    except OSError as exc:
        # As a shell would: 127 for a program not found, 126 for one that cannot run.
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        message = f"pico wrapper: cannot run {argv[0]!r}: {exc.strerror or exc}\n".encode()
        err = Stream(-1, err_path, cap)
        err.take(message)
        err.close()
        out = Stream(-1, out_path, cap)
        out.close()
        os.write(handshake, b"0\n")
        os.close(handshake)
        status.update(exit_code=code, **_counts(out, err))
        write_status(status_path, status)
        return 0
    assert child.stdout is not None and child.stderr is not None

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    os.write(handshake, f"{child.pid}\n".encode())
    os.close(handshake)

    out = Stream(child.stdout.fileno(), out_path, cap)
    err = Stream(child.stderr.fileno(), err_path, cap)
    selector = selectors.DefaultSelector()
    for stream in (out, err):
        selector.register(stream.pipe, selectors.EVENT_READ, stream)
    deadline: float | None = None
    returncode: int | None = None
    while selector.get_map():
        if returncode is None:
            returncode = child.poll()
            if returncode is not None:
                deadline = time.monotonic() + LINGER
        timeout = 0.2 if deadline is None else max(0.0, deadline - time.monotonic())
        ready = selector.select(timeout)
        for key, _ in ready:
            stream = key.data
            data = os.read(stream.pipe, CHUNK)
            if data:
                stream.take(data)
            else:
                selector.unregister(stream.pipe)
        if deadline is not None and time.monotonic() >= deadline:
            break
    returncode = child.wait()
    out.close()
    err.close()
    if returncode < 0:
        status["signal"] = -returncode
    else:
        status["exit_code"] = returncode
    status.update(_counts(out, err))
    write_status(status_path, status)
    return 0


def _counts(out: Stream, err: Stream) -> dict[str, object]:
    return {
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "stdout_kept": out.kept,
        "stderr_kept": err.kept,
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
