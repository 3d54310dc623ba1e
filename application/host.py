"""The process host port (seed §5.1 job, §8.7; issue 14): what a ``job`` records about an
OS process before it starts (``LaunchIntent``), once it runs (``ProcessIdentity``) and when
it ended (``ExitResult``), and the ``ProcessHost`` that launches, identifies, recovers,
observes and terminates it. No OS calls here; ``pico.infrastructure.host`` implements it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal, Protocol, Self

from pico.domain.errors import InvalidArgumentError
from pico.domain.ids import check_limit
from pico.domain.json import JsonObject

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_LOG_CAP",
    "MAX_GRACE",
    "MAX_LOG_CAP",
    "ExitResult",
    "LaunchIntent",
    "LaunchSpec",
    "ProcessHost",
    "ProcessIdentity",
    "ProcessState",
    "check_grace",
    "check_launch_spec",
]

#: Bytes kept per stream (stdout, stderr) unless a spec says otherwise: 8 MiB.
DEFAULT_LOG_CAP = 8 * 1024 * 1024
#: The largest retention cap a spec may ask for per stream: 1 TiB.
MAX_LOG_CAP = 2**40

#: What ``ProcessHost.identify`` answers: the recorded process still runs; it ended (its
#: pid holds no process, or only its unreaped exit); or the pid now belongs to another
#: process (a recycled pid, another boot, a different launch token).
ProcessState = Literal["running", "exited", "gone"]


#: Seconds between SIGTERM and SIGKILL when a job is aborted, unless it says otherwise.
DEFAULT_GRACE = 5.0
#: The longest grace a job may ask for: one hour.
MAX_GRACE = 3600.0


def check_grace(grace: object) -> float:
    if (
        type(grace) not in (int, float)
        or not math.isfinite(grace)  # type: ignore[arg-type]
        or not 0 <= grace <= MAX_GRACE  # type: ignore[operator]
    ):
        raise InvalidArgumentError(
            f"grace must be a number of seconds from 0 to {MAX_GRACE:.0f} (the time between "
            f"SIGTERM and SIGKILL when the job is aborted), got {grace!r}"
        )
    return float(grace)  # type: ignore[arg-type]


def _text(value: object, what: str) -> str:
    """A string the OS can take: no NUL, encodable as UTF-8 (so it is also strict JSON)."""
    if type(value) is not str:
        raise InvalidArgumentError(
            f"{what} must be a str, got {type(value).__name__}; pass text, not bytes or numbers"
        )
    if "\x00" in value:
        raise InvalidArgumentError(
            f"{what} contains a NUL character, which no OS argument, path or environment "
            f"variable can hold: {value[:60]!r}; remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{what} holds a lone surrogate and cannot be encoded as UTF-8: {value[:60]!r}"
        ) from None
    return value


def check_launch_spec(
    argv: object, cwd: object, env: object, log_cap: object
) -> tuple[tuple[str, ...], str | None, dict[str, str] | None, int]:
    """Checks what a ``LaunchSpec`` is built from and returns it normalized (argv as a
    tuple, env as a new dict). Raises ``InvalidArgumentError`` naming the argument: an argv
    that is not a non-empty list or tuple of str, any text with a NUL or a lone surrogate,
    an env key that is empty or holds ``=``, a ``log_cap`` outside 1..``MAX_LOG_CAP``."""
    if not isinstance(argv, (list, tuple)):
        raise InvalidArgumentError(
            f"argv must be a list or tuple of str (the program, then its arguments), got "
            f"{type(argv).__name__}; for a shell command pass ('sh', '-c', command)"
        )
    if not argv:
        raise InvalidArgumentError(
            "argv is empty; give at least the program to run, e.g. ('sh', '-c', 'make test')"
        )
    args = tuple(_text(item, f"argv[{i}]") for i, item in enumerate(argv))
    directory = None if cwd is None else _text(cwd, "cwd")
    if directory == "":
        raise InvalidArgumentError("cwd is empty; pass a directory, or None for the host's")
    environment: dict[str, str] | None = None
    if env is not None:
        if not isinstance(env, Mapping):
            raise InvalidArgumentError(
                f"env must be a mapping of str to str, or None to inherit the host's, got "
                f"{type(env).__name__}"
            )
        environment = {}
        for key, value in env.items():
            _text(key, "an env key")
            if not key or "=" in key:
                raise InvalidArgumentError(
                    f"env key {key!r} is not a variable name: it must be non-empty and hold no '='"
                )
            environment[key] = _text(value, f"env[{key!r}]")
    cap = check_limit(log_cap, "log_cap", maximum=MAX_LOG_CAP)
    return args, directory, environment, cap


@dataclass(frozen=True)
class LaunchSpec:
    """What to run: ``argv`` (no shell unless you ask for one), the working directory and
    the full environment (None inherits the host's), and ``log_cap``, the bytes kept per
    stream; output beyond it is read and discarded, and the log ends with a marker.
    Construction checks every field (``check_launch_spec``)."""

    argv: tuple[str, ...]
    cwd: str | None = None
    env: dict[str, str] | None = field(default=None, hash=False)
    log_cap: int = DEFAULT_LOG_CAP

    def __post_init__(self) -> None:
        argv, cwd, env, cap = check_launch_spec(self.argv, self.cwd, self.env, self.log_cap)
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "cwd", cwd)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "log_cap", cap)


#: The JSON types a record field may hold, by its annotation (the records below use only
#: these), and how an error names them.
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "str": ((str,), "str"),
    "int": ((int,), "int"),
    "bool": ((bool,), "bool"),
    "int | None": ((int, type(None)), "int or null"),
}


class _Record:
    """A frozen dataclass stored in a task's state as a JSON object: ``to_json`` writes
    its fields, ``from_json`` reads them back, each checked against its annotation (an
    exact type: a bool is not an int), so a stored value this host did not write is
    ``InvalidArgumentError``, never a half-built record."""

    _what: ClassVar[str]

    def to_json(self) -> JsonObject:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, value: object) -> Self:
        if not isinstance(value, dict):
            raise InvalidArgumentError(
                f"{cls._what} must be a JSON object, got {type(value).__name__}"
            )
        values: dict[str, object] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            types, kind = _KINDS[str(f.type)]
            item = value.get(f.name)
            if type(item) not in types:
                raise InvalidArgumentError(
                    f"{cls._what} field {f.name!r} must be {kind}, got "
                    f"{type(item).__name__}; the stored value is not one this host wrote"
                )
            values[f.name] = item
        return cls(**values)


@dataclass(frozen=True)
class LaunchIntent(_Record):
    """Recorded by the job's ``spawning`` command BEFORE the process starts: the launch
    token (a uuid4 hex the wrapper carries on its command line), the log files and the
    status file the wrapper will write when the process exits, and the cap the logs obey.
    With it a later owner can find the process and its outcome without launching again."""

    token: str
    stdout_path: str
    stderr_path: str
    status_path: str
    log_cap: int

    _what: ClassVar[str] = "a launch intent"


@dataclass(frozen=True)
class ProcessIdentity(_Record):
    """Recorded by ``running``: the supervising wrapper's pid, the process group its
    child runs in, the wrapper's start time as the OS reports it (Linux: field 22 of
    /proc/PID/stat, clock ticks since boot) and the boot it belongs to, and the launch
    token. A pid alone is not identity: a recycled pid has another start time or token."""

    pid: int
    pgid: int
    start_ticks: int
    boot_id: str
    token: str

    _what: ClassVar[str] = "a process identity"


@dataclass(frozen=True)
class ExitResult(_Record):
    """How the process ended, as its wrapper recorded it: ``exit_code`` (a normal exit) or
    ``signal`` (the number that killed it), the log files, the bytes each stream produced,
    whether a log stopped at the cap, and a bounded tail of each stream: the last bytes of
    what the log KEPT (before any truncation marker), decoded as UTF-8 with replacement."""

    exit_code: int | None
    signal: int | None
    stdout_path: str
    stderr_path: str
    stdout_tail: str
    stderr_tail: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool

    _what: ClassVar[str] = "an exit result"


class ProcessHost(Protocol):
    """Launches and observes a job's OS process (§8.7). The job flow records ``intend``'s
    answer, then calls ``launch`` once, records the identity, then observes with ``wait``.
    A later owner never launches again: it asks ``identify``; "running" is adopted (``wait``),
    anything else goes to ``recover``, whose None means the outcome is lost."""

    def intend(self, spec: LaunchSpec, *, directory: str) -> LaunchIntent:
        """A fresh token and the log and status paths under ``directory``. Pure: nothing
        is created or started."""
        ...

    def launch(self, spec: LaunchSpec, intent: LaunchIntent) -> ProcessIdentity:
        """Starts the process (once per intent) in its own session and process group."""
        ...

    def find(self, intent: LaunchIntent) -> ProcessIdentity | None:
        """The running process launched for ``intent``, or None: how a later owner adopts a
        job whose identity was never recorded (it died between launch and ``running``)."""
        ...

    def launched(self, intent: LaunchIntent) -> bool:
        """Whether ``launch`` was ever called for ``intent`` (False: no process exists)."""
        ...

    def identify(self, identity: ProcessIdentity) -> ProcessState:
        """Whether the recorded process (pid + start time + boot + token) still runs."""
        ...

    def recover(self, intent: LaunchIntent, identity: ProcessIdentity | None) -> ExitResult | None:
        """The exit the wrapper recorded in its status file, or None when there is none."""
        ...

    async def wait(self, identity: ProcessIdentity, intent: LaunchIntent) -> ExitResult | None:
        """Returns once the process exited and its output is drained: its result, or None
        when it ended without a status (its wrapper was killed): record it lost."""
        ...

    async def terminate(
        self, identity: ProcessIdentity, intent: LaunchIntent, *, grace: float
    ) -> ExitResult | None:
        """SIGTERM to the process group, ``grace`` seconds, then SIGKILL; drains; the
        result's ``signal`` names the one that ended it (or its exit code, if it exited)."""
        ...
