"""The process host against real processes (§8.7; issue 14): ``sh -c`` jobs launched
through the supervising wrapper, observed, terminated, and adopted by a second process
after the one that launched them was SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from pico.application.host import ExitResult, LaunchIntent, LaunchSpec, ProcessIdentity
from pico.domain.errors import InvalidArgumentError
from pico.infrastructure.host import PosixProcessHost
from pico.infrastructure.host.process import proc_stat
from tests.processes import spawn_child


@pytest.fixture(params=["pidfd", "polling"])
def host(request: pytest.FixtureRequest) -> PosixProcessHost:
    return PosixProcessHost(tail_bytes=64, use_pidfd=request.param == "pidfd")


def _run(host: PosixProcessHost, tmp_path: Path, script: str, **kw: object) -> ExitResult:
    spec = LaunchSpec(("sh", "-c", script), **kw)  # type: ignore[arg-type]
    intent = host.intend(spec, directory=str(tmp_path / "jobs"))
    identity = host.launch(spec, intent)
    result = asyncio.run(host.wait(identity, intent))
    assert result is not None
    return result


def _wrappers(token: str) -> list[int]:
    """Pids of live processes whose command line carries ``token`` (the wrapper's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if token.encode() in args:
            found.append(int(entry))
    return found


def test_a_job_reports_its_output_and_exit_code(host: PosixProcessHost, tmp_path: Path) -> None:
    result = _run(host, tmp_path, "echo hello; echo warning >&2; exit 0")
    assert (result.exit_code, result.signal) == (0, None)
    assert (result.stdout_tail, result.stderr_tail) == ("hello\n", "warning\n")
    assert Path(result.stdout_path).read_bytes() == b"hello\n"
    assert (result.stdout_bytes, result.stdout_truncated) == (6, False)


def test_a_non_zero_exit_is_recorded_with_its_code(host: PosixProcessHost, tmp_path: Path) -> None:
    result = _run(host, tmp_path, "echo failing >&2; exit 3")
    assert (result.exit_code, result.signal, result.stderr_tail) == (3, None, "failing\n")


def test_a_job_killed_by_a_signal_reports_the_signal(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    result = _run(host, tmp_path, "echo before; kill -KILL $$")
    assert (result.exit_code, result.signal) == (None, signal.SIGKILL)
    assert result.stdout_tail == "before\n"


def test_a_program_that_does_not_exist_exits_127_with_the_reason_in_its_log(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    spec = LaunchSpec(("/nonexistent/program",))
    intent = host.intend(spec, directory=str(tmp_path))
    result = asyncio.run(host.wait(host.launch(spec, intent), intent))
    assert result is not None and result.exit_code == 127
    assert "cannot run '/nonexistent/program'" in result.stderr_tail


def test_cwd_and_env_reach_the_job(host: PosixProcessHost, tmp_path: Path) -> None:
    result = _run(
        host, tmp_path, 'pwd; echo "$GREETING"', cwd=str(tmp_path), env={"GREETING": "hi"}
    )
    assert Path(result.stdout_path).read_text() == f"{tmp_path}\nhi\n"


def test_output_beyond_the_cap_stops_the_log_at_the_cap_and_a_marker(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    # 3,000 numbered lines of 5 bytes each; the log keeps the first 1,000 bytes.
    result = _run(
        host, tmp_path, "i=1000; while [ $i -lt 4000 ]; do echo $i; i=$((i+1)); done", log_cap=1000
    )
    kept = Path(result.stdout_path).read_bytes()
    assert kept.startswith(b"1000\n1001\n")
    assert kept[:1000] == b"".join(b"%d\n" % i for i in range(1000, 1200))
    assert kept[1000:] == b"\n[pico: log truncated at 1000 bytes; further output was discarded]\n"
    # Check: the tail is the end of what was KEPT, not of what was produced.
    assert (
        result.stdout_tail
        == "".join(f"{i}\n" for i in range(1200))[-64:][: len(result.stdout_tail)]
    )
    assert result.stdout_tail.endswith("1198\n1199\n") and len(result.stdout_tail) == 64
    assert (result.stdout_bytes, result.stdout_truncated) == (15000, True)


def test_a_tail_cut_inside_a_character_drops_the_partial_character(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    # 'é' is two bytes; 33 of them are 66 bytes, so a 64-byte tail starts mid-character
    # only if the output has an odd prefix: one 'x' first.
    result = _run(
        host, tmp_path, "printf 'x'; i=0; while [ $i -lt 33 ]; do printf 'é'; i=$((i+1)); done"
    )
    assert result.stdout_tail == "é" * 32


def test_sigterm_ends_a_long_sleep_and_the_result_names_it(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    spec = LaunchSpec(("sh", "-c", "echo started; exec sleep 30"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)

    async def stop() -> tuple[ExitResult | None, float]:
        while Path(intent.stdout_path).read_bytes() != b"started\n":
            await asyncio.sleep(0.01)
        began = time.monotonic()
        return await host.terminate(identity, intent, grace=10), time.monotonic() - began

    result, took = asyncio.run(stop())
    assert result is not None and (result.exit_code, result.signal) == (None, signal.SIGTERM)
    assert result.stdout_tail == "started\n"
    assert took < 5  # SIGTERM was honoured; the 10 s grace was not used up
    assert host.identify(identity) == "exited"


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    host = PosixProcessHost()
    spec = LaunchSpec(("sh", "-c", "trap '' TERM; echo trapped; sleep 30"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)

    async def stop() -> tuple[ExitResult | None, float]:
        while Path(intent.stdout_path).read_bytes() != b"trapped\n":
            await asyncio.sleep(0.01)
        began = time.monotonic()
        return await host.terminate(identity, intent, grace=0.5), time.monotonic() - began

    result, took = asyncio.run(stop())
    assert result is not None and (result.exit_code, result.signal) == (None, signal.SIGKILL)
    assert 0.5 <= took < 3
    assert result.stdout_tail == "trapped\n"
    assert _wrappers(intent.token) == []


HARNESS = """
import json, sys, time
from pico.application.host import LaunchSpec
from pico.infrastructure.host import PosixProcessHost
host = PosixProcessHost()
spec = LaunchSpec(("sh", "-c", sys.argv[2]))
intent = host.intend(spec, directory=sys.argv[1])
identity = host.launch(spec, intent)
print(json.dumps([intent.to_json(), identity.to_json()]), flush=True)
time.sleep(60)
"""


def _launch_from_a_harness_then_kill_it(
    tmp_path: Path, script: str
) -> tuple[LaunchIntent, ProcessIdentity]:
    """A stand-in harness process launches ``script`` and is SIGKILLed once it has
    recorded the intent and identity (printed here as JSON, as a task's state would)."""
    harness = spawn_child(HARNESS, str(tmp_path), script)
    assert harness.stdout is not None
    intent, identity = json.loads(harness.stdout.readline())
    harness.kill()
    harness.wait()
    harness.stdout.close()
    return LaunchIntent.from_json(intent), ProcessIdentity.from_json(identity)


def test_a_job_outlives_its_harness_and_is_adopted_without_a_second_process(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    intent, identity = _launch_from_a_harness_then_kill_it(
        tmp_path, f"echo adopted; while [ ! -e {gate} ]; do sleep 0.02; done; exit 4"
    )
    # Check: the harness is dead, the job runs on: the same wrapper, one of it.
    assert host.identify(identity) == "running"
    assert _wrappers(intent.token) == [identity.pid]
    assert host.recover(intent, identity) is None  # no outcome yet

    async def adopt() -> ExitResult | None:
        waiting = asyncio.ensure_future(host.wait(identity, intent))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        gate.touch()
        return await asyncio.wait_for(waiting, 5)

    result = asyncio.run(adopt())
    assert result is not None and (result.exit_code, result.stdout_tail) == (4, "adopted\n")
    assert _wrappers(intent.token) == []


def test_a_job_that_exited_while_nobody_watched_is_recovered_from_its_status_file(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    intent, identity = _launch_from_a_harness_then_kill_it(tmp_path, "echo alone; exit 7")
    deadline = time.monotonic() + 5
    while host.identify(identity) == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.identify(identity) == "exited"
    result = host.recover(intent, identity)
    assert result is not None and (result.exit_code, result.stdout_tail) == (7, "alone\n")
    # Check: the status file is what the wrapper wrote atomically, no temporary left.
    assert json.loads(Path(intent.status_path).read_text())["exit_code"] == 7
    assert not Path(intent.status_path + ".tmp").exists()


def test_a_recycled_pid_is_gone_not_running(host: PosixProcessHost, tmp_path: Path) -> None:
    spec = LaunchSpec(("sh", "-c", "sleep 30"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)
    try:
        assert host.identify(identity) == "running"
        # The recorded pid is alive but is another process: other start time, other
        # token, or another boot.
        for other in (
            ProcessIdentity(
                identity.pid,
                identity.pgid,
                identity.start_ticks - 1,
                identity.boot_id,
                identity.token,
            ),
            ProcessIdentity(
                identity.pid, identity.pgid, identity.start_ticks, identity.boot_id, "f" * 32
            ),
            ProcessIdentity(
                identity.pid, identity.pgid, identity.start_ticks, "another-boot", identity.token
            ),
        ):
            assert host.identify(other) == "gone"
        # A process that is not a wrapper at all holding the pid (here: pytest itself).
        this = proc_stat(os.getpid())
        assert this is not None
        me = ProcessIdentity(os.getpid(), os.getpid(), this[1], identity.boot_id, identity.token)
        assert host.identify(me) == "gone"
    finally:
        asyncio.run(host.terminate(identity, intent, grace=1))


def test_a_job_whose_wrapper_died_without_a_status_file_cannot_be_recovered(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    spec = LaunchSpec(("sh", "-c", "sleep 30"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)
    os.kill(identity.pid, signal.SIGKILL)  # the wrapper itself: nobody writes the status
    os.killpg(identity.pgid, signal.SIGKILL)
    assert asyncio.run(host.wait(identity, intent)) is None
    assert host.identify(identity) == "exited"
    assert host.recover(intent, identity) is None
    assert host.recover(intent, None) is None


def test_an_intent_is_launched_at_most_once(host: PosixProcessHost, tmp_path: Path) -> None:
    spec = LaunchSpec(("sh", "-c", "exit 0"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)
    assert asyncio.run(host.wait(identity, intent)) is not None
    before = Path(intent.stdout_path).stat()
    with pytest.raises(InvalidArgumentError, match="launched before"):
        host.launch(spec, intent)
    assert Path(intent.stdout_path).stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"argv": ()}, "argv is empty"),
        ({"argv": "sh -c true"}, "argv must be a list or tuple"),
        ({"argv": ("sh", 1)}, r"argv\[1\] must be a str"),
        ({"argv": ("sh", "-c", "echo a\x00b")}, r"argv\[2\] contains a NUL"),
        ({"argv": ("echo", "\ud800")}, "lone surrogate"),
        ({"argv": ("true",), "cwd": "/tmp\x00x"}, "cwd contains a NUL"),
        ({"argv": ("true",), "env": {"A=B": "c"}}, "env key 'A=B'"),
        ({"argv": ("true",), "env": {"A": 1}}, r"env\['A'\] must be a str"),
        ({"argv": ("true",), "log_cap": 0}, "log_cap must be an integer from 1"),
        ({"argv": ("true",), "log_cap": True}, "log_cap must be an integer from 1"),
        ({"argv": ("true",), "log_cap": 2**41}, "log_cap must be an integer from 1"),
    ],
)
def test_a_malformed_launch_spec_is_refused_and_nothing_starts(
    kwargs: dict[str, object], message: str, tmp_path: Path
) -> None:
    before = _processes()
    with pytest.raises(InvalidArgumentError, match=message):
        LaunchSpec(**kwargs)  # type: ignore[arg-type]
    assert _processes() == before and list(tmp_path.iterdir()) == []


def test_a_missing_cwd_is_refused_at_launch_and_nothing_starts(tmp_path: Path) -> None:
    host = PosixProcessHost()
    spec = LaunchSpec(("true",), cwd=str(tmp_path / "missing"))
    intent = host.intend(spec, directory=str(tmp_path / "jobs"))
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        host.launch(spec, intent)
    assert not Path(intent.stdout_path).exists() and _wrappers(intent.token) == []


def test_records_round_trip_through_json(host: PosixProcessHost, tmp_path: Path) -> None:
    result = _run(host, tmp_path, "echo x")
    spec = LaunchSpec(("true",))
    intent = host.intend(spec, directory=str(tmp_path))
    assert LaunchIntent.from_json(json.loads(json.dumps(intent.to_json()))) == intent
    assert ExitResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    with pytest.raises(InvalidArgumentError, match="'pid' must be int"):
        ProcessIdentity.from_json(
            {"pid": "1", "pgid": 1, "start_ticks": 1, "boot_id": "b", "token": "t"}
        )
    # A bool is not an int, a missing field is refused, a non-object too.
    with pytest.raises(InvalidArgumentError, match="'pgid' must be int, got bool"):
        ProcessIdentity.from_json(
            {"pid": 1, "pgid": True, "start_ticks": 1, "boot_id": "b", "token": "t"}
        )
    with pytest.raises(InvalidArgumentError, match="'token' must be str, got NoneType"):
        ProcessIdentity.from_json({"pid": 1, "pgid": 1, "start_ticks": 1, "boot_id": "b"})
    with pytest.raises(InvalidArgumentError, match="must be a JSON object, got list"):
        LaunchIntent.from_json([])
    # An exit by a signal stores no exit code: null reads back as None.
    by_signal = {**result.to_json(), "exit_code": None, "signal": 9}
    assert ExitResult.from_json(by_signal).signal == 9
    with pytest.raises(InvalidArgumentError, match="'signal' must be int or null"):
        ExitResult.from_json({**by_signal, "signal": "9"})


def test_a_launched_job_runs_in_its_own_session_and_group(
    host: PosixProcessHost, tmp_path: Path
) -> None:
    spec = LaunchSpec(("sh", "-c", "sleep 30"))
    intent = host.intend(spec, directory=str(tmp_path))
    identity = host.launch(spec, intent)
    try:
        assert os.getsid(identity.pid) == identity.pid != os.getsid(0)
        assert os.getpgid(identity.pgid) == identity.pgid != os.getpgid(0)
    finally:
        asyncio.run(host.terminate(identity, intent, grace=1))


def _processes() -> set[int]:
    """Live children of this test process (a started job's wrapper would be one)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != b"Z":
                found.add(int(entry))
    return found
