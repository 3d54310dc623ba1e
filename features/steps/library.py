"""The reusable step library: domain words -> public API calls.

Names in quotes are aliases a scenario gives to conversations, entries and positions;
the world maps them to the ids the session allocated. Steps never touch the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

import pico
from pico.application.tasks import TaskExecution
from tests.backends import Backend
from tests.scheddefs import Scripted, settle


@dataclass
class World:
    backend: Backend
    runner: asyncio.Runner
    harness: pico.Harness | None = None
    names: dict[str, int] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    error: Exception | None = None
    head_before: int | None = None
    others: list[pico.Harness] = field(default_factory=list)
    addresses: dict[str, Any] = field(default_factory=dict)
    work: Scripted = field(default_factory=lambda: _scripted())
    outcome: str | None = None
    agent: Any = None  # the agent steps' model, clock and tools

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    @property
    def h(self) -> pico.Harness:
        assert self.harness is not None, "the scenario has no open session"
        return self.harness

    def conv(self, name: str) -> pico.ConversationHandle:
        return pico.ConversationHandle(self.h, self.names[name])

    def id(self, name: str) -> int:
        if name not in self.names:
            raise AssertionError(f"no entry or conversation is called {name!r} in this scenario")
        return self.names[name]

    def ids(self, text: str) -> list[int]:
        return [self.id(n.strip()) for n in text.split(",") if n.strip()]

    def alias(self, ident: int) -> str:
        for name, value in self.names.items():
            if value == ident:
                return name
        return str(ident)

    def attempt(self, coro: Any) -> None:
        """Run a command that may be rejected; remember the rejection for a Then step."""
        self.head_before = self.h.head()
        self.error = None
        try:
            self.run(coro)
        except pico.PicoError as exc:
            self.error = exc


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


# ------------------------------------------------------------------ Given


@given(parsers.parse('a session with conversation "{name}"'), target_fixture="world")
def a_session(world: World, name: str) -> World:
    world.harness = world.run(world.backend.open(definitions=[world.work]))
    world.names[name] = world.run(world.h.root()).id
    return world


@given(parsers.parse('"{conv}" has the messages "{names}"'))
@when(parsers.parse('"{conv}" receives the messages "{names}"'))
def has_messages(world: World, conv: str, names: str) -> None:
    """Each message is appended and selected in its own command; users and assistants
    alternate."""
    for i, name in enumerate(_names(names)):
        kind = "user" if i % 2 == 0 else "assistant"
        world.names[name] = world.run(world.conv(conv).append(kind, f"{name}"))


@given(parsers.parse('"{conv}" has the note "{name}" that is not in context'))
def has_note(world: World, conv: str, name: str) -> None:
    world.names[name] = world.run(world.conv(conv).append("note", name, select=False))


@given(parsers.parse('"{conv}" has an assistant message "{name}" calling tools "{calls}"'))
@when(parsers.parse('"{conv}" receives an assistant message "{name}" calling tools "{calls}"'))
def calls_tools(world: World, conv: str, name: str, calls: str) -> None:
    meta: dict[str, Any] = {"tool_calls": list(_names(calls))}
    world.names[name] = world.run(world.conv(conv).append("assistant", name, metadata=meta))


@given(parsers.parse('"{conv}" has the tool result "{name}" for call "{call}"'))
@when(parsers.parse('"{conv}" receives the tool result "{name}" for call "{call}"'))
def tool_result(world: World, conv: str, name: str, call: str) -> None:
    meta: dict[str, Any] = {"tool_call_id": call}
    world.names[name] = world.run(world.conv(conv).append("tool", name, metadata=meta))


@given(parsers.parse('the current position is remembered as "{name}"'))
@when(parsers.parse('the current position is remembered as "{name}"'))
def remember_position(world: World, name: str) -> None:
    world.positions[name] = world.h.main_head()


# ------------------------------------------------------------------ When


@when(parsers.parse('"{conv}" is compacted through "{through}" with summary "{summary}"'))
def compacted(world: World, conv: str, through: str, summary: str) -> None:
    world.names[summary] = world.run(world.conv(conv).compact(summary, through=world.id(through)))


@when(parsers.parse('"{conv}" hands off with "{name}"'))
def hands_off(world: World, conv: str, name: str) -> None:
    world.names[name] = world.run(world.conv(conv).handoff(name))


@when(parsers.parse('the context of "{conv}" is reset to nothing'))
def reset_empty(world: World, conv: str) -> None:
    world.run(world.conv(conv).reset_context([]))


@when(parsers.parse('"{new}" is forked from "{source}" at entry "{entry}"'))
def fork_at_entry(world: World, new: str, source: str, entry: str) -> None:
    world.names[new] = world.run(world.conv(source).fork(at_entry=world.id(entry))).id


@when(parsers.parse('"{new}" is forked from "{source}" at position "{position}"'))
def fork_at_position(world: World, new: str, source: str, position: str) -> None:
    world.names[new] = world.run(world.conv(source).fork(as_of=world.positions[position])).id


@when(parsers.parse('one command appends "{names}" to "{conv}" and selects them'))
def one_command(world: World, conv: str, names: str) -> None:
    cid = world.id(conv)
    wanted = _names(names)

    def build(tx: pico.Command) -> list[int]:
        ids = [tx.append_entry(cid, "user", n) for n in wanted]
        tx.append_context(cid, ids)
        return ids

    for name, ident in zip(wanted, world.run(world.h.command(build)), strict=True):
        world.names[name] = ident


@when(parsers.parse('a command that appends "{name}" to "{conv}" fails'))
def failing_command(world: World, name: str, conv: str) -> None:
    cid = world.id(conv)

    def build(tx: pico.Command) -> None:
        tx.append_entry(cid, "user", name)
        raise RuntimeError("the builder gave up")

    world.head_before = world.h.head()
    with pytest.raises(RuntimeError):
        world.run(world.h.command(build))


@when(parsers.parse('"{conv}" tries to select "{names}"'))
def try_select(world: World, conv: str, names: str) -> None:
    world.attempt(world.conv(conv).append_context(world.ids(names)))


@when(parsers.parse('"{conv}" tries to compact through "{through}"'))
def try_compact(world: World, conv: str, through: str) -> None:
    world.attempt(world.conv(conv).compact("summary", through=world.id(through)))


@when(parsers.parse('"{conv}" tries to reset its context to "{names}"'))
def try_reset(world: World, conv: str, names: str) -> None:
    world.attempt(world.conv(conv).reset_context(world.ids(names)))


@when(parsers.parse('"{new}" tries to fork from "{source}" at entry "{entry}"'))
def try_fork_entry(world: World, new: str, source: str, entry: str) -> None:
    world.attempt(world.conv(source).fork(at_entry=world.id(entry)))


@when(parsers.parse('a fork of "{source}" is attempted at the sequence number of "{entry}"'))
def try_fork_inside(world: World, source: str, entry: str) -> None:
    world.attempt(world.conv(source).fork(as_of=world.id(entry)))


@when("a second owner opens the session")
def second_owner(world: World) -> None:
    world.others.append(world.run(world.backend.open()))


@when("a second owner tries to open the session")
def second_owner_tries(world: World) -> None:
    async def open_other() -> None:
        world.others.append(await world.backend.open())

    world.attempt(open_other())


@when(parsers.parse('the first owner tries to append "{name}" to "{conv}"'))
def first_owner_appends(world: World, name: str, conv: str) -> None:
    world.attempt(world.conv(conv).append("user", name))


@when("the session is closed and opened again")
def reopen(world: World) -> None:
    world.run(world.h.close())
    world.harness = world.run(world.backend.open(definitions=[world.work]))


# ------------------------------------------------------------------ Then


def _show(world: World, ids: Any) -> str:
    return ", ".join(world.alias(i) for i in ids) or "nothing"


@then(parsers.parse('the transcript of "{conv}" is "{names}"'))
def transcript_is(world: World, conv: str, names: str) -> None:
    page = world.run(world.conv(conv).entries(limit=1000))
    assert _show(world, [e.id for e in page.items]) == ", ".join(_names(names))


@then(parsers.parse('the context of "{conv}" is "{names}"'))
def context_is(world: World, conv: str, names: str) -> None:
    snap = world.run(world.conv(conv).snapshot())
    assert _show(world, snap.context) == ", ".join(_names(names))


@then(parsers.parse('the context of "{conv}" is empty'))
def context_empty(world: World, conv: str) -> None:
    assert world.run(world.conv(conv).snapshot()).context == ()


@then(parsers.parse('the context of "{conv}" at position "{position}" was "{names}"'))
def context_was(world: World, conv: str, position: str, names: str) -> None:
    ctx = world.run(world.conv(conv).context_as_of(world.positions[position]))
    assert _show(world, ctx) == ", ".join(_names(names))


@then(parsers.parse('entries "{names}" still belong to "{conv}"'))
def entries_belong(world: World, names: str, conv: str) -> None:
    found = world.run(world.h.get_entries(world.ids(names)))
    assert {e.conversation_id for e in found.values()} == {world.id(conv)}


@then(parsers.parse('"{a}" and "{b}" start from the same snapshot'))
def same_snapshot(world: World, a: str, b: str) -> None:
    sa_, sb = world.run(world.conv(a).snapshot()), world.run(world.conv(b).snapshot())
    assert sa_.context == sb.context and sa_.source == sb.source


@then(parsers.parse('"{fork}" was forked from "{source}" after the commit of "{entry}"'))
def forked_after_commit(world: World, fork: str, source: str, entry: str) -> None:
    snap = world.run(world.conv(fork).snapshot())
    found = world.run(world.h.entry(world.id(entry)))
    assert snap.source == pico.Source(world.id(source), found.commit_end)


@then(parsers.parse('"{later}" is numbered right after "{earlier}"'))
def numbered_after(world: World, later: str, earlier: str) -> None:
    assert world.id(later) == world.id(earlier) + 1


@then(parsers.parse('the commit of "{entry}" ends at {offset:d} after "{other}"'))
def commit_ends(world: World, entry: str, offset: int, other: str) -> None:
    found = world.run(world.h.entry(world.id(entry)))
    assert found.commit_end == world.id(other) + offset


@then(parsers.parse('"{later}" is numbered right after the commit of "{entry}"'))
def after_commit(world: World, later: str, entry: str) -> None:
    found = world.run(world.h.entry(world.id(entry)))
    assert world.id(later) == found.commit_end + 1


@then(parsers.parse("it is rejected as {error}"))
def rejected_as(world: World, error: str) -> None:
    assert world.error is not None, "the command was accepted"
    expected = getattr(pico, error.strip())
    assert isinstance(world.error, expected), repr(world.error)


@then("nothing was written")
def nothing_written(world: World) -> None:
    assert world.head_before is not None
    current = world.others[-1] if world.others else world.h  # the newest owner
    assert current.head() == world.head_before


# ------------------------------------------------------------------ scoped state (§4)

_ADDRESS_KINDS: dict[str, Callable[[str], Any]] = {
    "rewindable conversation value": lambda n: pico.conversation_value(n),
    "sticky conversation value": lambda n: pico.conversation_value(n, rewind=False),
    "rewindable conversation list": lambda n: pico.conversation_list(n),
    "sticky conversation list": lambda n: pico.conversation_list(n, rewind=False),
    "session value": lambda n: pico.session_value(n),
}


def _address(world: World, name: str) -> Any:
    found = world.addresses.get(name)
    if found is None:
        raise AssertionError(f"no state address called {name!r} was declared in this scenario")
    return found


def _json(text: str) -> Any:
    import json

    return json.loads(text)


@given(parsers.parse('"{name}" is a {kind}'))
def declare_address(world: World, name: str, kind: str) -> None:
    world.addresses[name] = _ADDRESS_KINDS[kind](f"feature.{name}")


@given(parsers.parse('"{conv}" sets "{name}" to {value}'))
@when(parsers.parse('"{conv}" sets "{name}" to {value}'))
def sets_value(world: World, conv: str, name: str, value: str) -> None:
    world.run(world.conv(conv).set_value(_address(world, name), _json(value)))


@when(parsers.parse('"{conv}" deletes "{name}"'))
def deletes_value(world: World, conv: str, name: str) -> None:
    world.run(world.conv(conv).delete_value(_address(world, name)))


@given(parsers.parse('"{conv}" appends {value} to "{name}"'))
@when(parsers.parse('"{conv}" appends {value} to "{name}"'))
def appends_item(world: World, conv: str, value: str, name: str) -> None:
    world.run(world.conv(conv).append_list(_address(world, name), _json(value)))


@given(parsers.parse('"{conv}" clears "{name}"'))
@when(parsers.parse('"{conv}" clears "{name}"'))
def clears_list(world: World, conv: str, name: str) -> None:
    world.run(world.conv(conv).clear_list(_address(world, name)))


@when(parsers.parse('"{new}" is forked from "{source}" at entry "{entry}" copying "{names}"'))
def fork_copying(world: World, new: str, source: str, entry: str, names: str) -> None:
    sticky = [_address(world, n) for n in _names(names)]
    handle = world.run(world.conv(source).fork(at_entry=world.id(entry), sticky=sticky))
    world.names[new] = handle.id


@then(parsers.parse('"{conv}" reads "{name}" as {value}'))
def reads_value(world: World, conv: str, name: str, value: str) -> None:
    address = _address(world, name)
    if value == "absent":
        assert world.run(world.conv(conv).get_stored(address)) is None
        return
    if address.kind == "list":
        page = world.run(world.conv(conv).read_list(address, limit=1000))
        assert [e.value for e in page.items] == _json(value)
    else:
        stored = world.run(world.conv(conv).get_stored(address))
        assert stored is not None, f"{name} is absent in {conv}"
        assert stored.value == _json(value)


@then(parsers.parse('"{conv}" read "{name}" at position "{position}" as {value}'))
def reads_at(world: World, conv: str, name: str, position: str, value: str) -> None:
    address = _address(world, name)
    at = world.positions[position]
    page = world.run(world.conv(conv).read_list(address, as_of=at, limit=1000))
    assert [e.value for e in page.items] == _json(value)


@when(parsers.parse('task "{scope}" records the frames {values}'))
def records_frames(world: World, scope: str, values: str) -> None:
    ws = pico.working_scope(scope)
    frames = pico.working_list("feature.frames", scope=ws)

    def build(tx: pico.WorkingCommand) -> None:
        for v in _json(values):
            tx.append_list(frames, v)

    world.run(world.h.command(ws, build))


@when(parsers.parse('"{conv}" settles task "{scope}" with the answer "{name}"'))
def settles(world: World, conv: str, scope: str, name: str) -> None:
    cid = world.id(conv)

    def build(tx: pico.Command) -> int:
        entry = tx.append_entry(cid, "assistant", name)
        tx.append_context(cid, [entry])
        tx.retire_working_scope(pico.working_scope(scope))
        return entry

    world.names[name] = world.run(world.h.command(build))


@then(parsers.parse('the frames of task "{scope}" are {values}'))
def frames_are(world: World, scope: str, values: str) -> None:
    frames = pico.working_list("feature.frames", scope=pico.working_scope(scope))
    page = world.run(world.h.read_list(frames, limit=1000))
    assert [e.value for e in page.items] == _json(values)


@then("the main history did not advance")
def main_history_unchanged(world: World) -> None:
    assert world.h.main_head() == world.positions["before working"]


# ------------------------------------------------------------------ tasks (§5, §6)
# Task behaviour comes from the task's state, so a scenario names intent, not code:
#   {"role": "delegator"}  delegates to a subagent (an owned child conversation) and waits
#                          durably for it by depending on the subagent's owner task;
#   {"role": "child"}      settles itself and its owner in one command, with a result;
#   {"role": "outside"}    waits for an outside event (stays waiting);
#   anything else          settles "done" when executed.


def _scripted() -> Scripted:
    work = Scripted()
    work.on_execute = _execute
    work.on_recover = _recover
    return work


async def _execute(task: pico.TaskSnapshot, ctx: TaskExecution) -> None:
    state = task.state if isinstance(task.state, dict) else {}
    role = state.get("role")
    if role == "delegator" and not state.get("owner"):
        permit = str(state["permit"]) if state.get("permit") is not None else None

        def delegate(tx: pico.Command) -> None:  # ONE command, then the effect returns
            owner = tx.create_task(
                task.conversation_id,
                "work",
                status="waiting",
                state={"role": "owner"},
                spawned_by=task.id,
            )
            child = tx.create_owned_conversation(owner)
            tx.create_task(
                child,
                "work",
                foreground=True,
                required_permit=permit,
                state={"role": "child", "owner": owner},
            )
            tx.patch_task(task.id, state={**state, "owner": owner}, after=[owner])

        await ctx.command(delegate)
    elif role == "delegator":
        owner = state["owner"]
        assert isinstance(owner, int)
        settled = ctx.task(owner)  # the subagent's stored outcome, not a promise
        owner_state = settled.state if settled is not None else None
        answer = owner_state.get("result") if isinstance(owner_state, dict) else None
        await ctx.command(
            lambda tx: tx.patch_task(task.id, status="done", state={**state, "result": answer})
        )
    elif role == "child":
        owner = state["owner"]
        assert isinstance(owner, int)

        def finish(tx: pico.Command) -> None:  # the child settles its owner too
            tx.patch_task(task.id, status="done")
            owner_task = tx.get_task(owner)
            if owner_task is not None and not owner_task.abort_requested:
                tx.patch_task(
                    owner, status="done", state={"role": "owner", "result": "the subagent's answer"}
                )

        await ctx.command(finish)
    elif role == "outside":
        await ctx.command(lambda tx: tx.patch_task(task.id, status="waiting"))
    else:
        await settle(ctx, "done")


async def _recover(task: pico.TaskSnapshot, ctx: TaskExecution) -> None:
    if task.role == "waiting":
        return  # waiting for its child or an outside event
    await settle(ctx, "done")


def _add_task(world: World, conv: str, name: str, **kw: Any) -> None:
    cid = world.id(conv)
    world.names[name] = world.run(world.h.command(lambda tx: tx.create_task(cid, "work", **kw)))


Q = r'"(?P<{}>[^"]+)"'  # one quoted name, never spanning quotes
GROUND = r"(?P<ground>foreground|background)"


@given(parsers.re(rf"{Q.format('conv')} has a {GROUND} task {Q.format('name')}$"))
def has_task(world: World, conv: str, ground: str, name: str) -> None:
    _add_task(world, conv, name, foreground=ground == "foreground")


@given(parsers.re(rf"{Q.format('conv')} has a task {Q.format('name')} that has failed$"))
def has_failed_task(world: World, conv: str, name: str) -> None:
    _add_task(world, conv, name, status="failed")


@given(parsers.re(rf"{Q.format('conv')} has a task {Q.format('name')} that is done$"))
def has_done_task(world: World, conv: str, name: str) -> None:
    _add_task(world, conv, name, status="done")


@given(
    parsers.re(
        rf"{Q.format('conv')} has a {GROUND} task {Q.format('name')} that waits for the outside$"
    )
)
def has_waiting_task(world: World, conv: str, ground: str, name: str) -> None:
    _add_task(
        world,
        conv,
        name,
        status="waiting",
        state={"role": "outside"},
        foreground=ground == "foreground",
    )


@given(
    parsers.re(
        rf"{Q.format('conv')} has a {GROUND} task {Q.format('name')} that runs after "
        rf"{Q.format('deps')}$"
    )
)
def has_dependent_task(world: World, conv: str, ground: str, name: str, deps: str) -> None:
    _add_task(world, conv, name, after=world.ids(deps), foreground=ground == "foreground")


@given(
    parsers.re(
        rf"{Q.format('conv')} has a foreground task {Q.format('name')} that delegates to a "
        rf"subagent whose work needs permission {Q.format('permit')}$"
    )
)
def has_delegator(world: World, conv: str, name: str, permit: str) -> None:
    _add_task(world, conv, name, foreground=True, state={"role": "delegator", "permit": permit})


@when(parsers.parse('"{conv}" is driven'))
def drive_conversation(world: World, conv: str) -> None:
    world.outcome = world.run(asyncio.wait_for(world.conv(conv).drive(), 10))


@when(parsers.parse('"{conv}" is driven with permission "{permit}"'))
def drive_with_permit(world: World, conv: str, permit: str) -> None:
    world.outcome = world.run(asyncio.wait_for(world.conv(conv).drive(permits=[permit]), 10))


@when("the session is driven")
def drive_session(world: World) -> None:
    world.outcome = world.run(asyncio.wait_for(world.h.drive(), 10))


@when(parsers.parse('"{conv}" is aborted'))
def abort_conversation(world: World, conv: str) -> None:
    world.run(world.conv(conv).abort())


@then(parsers.parse('the drive ends "{outcome}"'))
def drive_ended(world: World, outcome: str) -> None:
    assert world.outcome == outcome


@then(parsers.parse('task "{name}" has run'))
def task_ran(world: World, name: str) -> None:
    assert ("execute", world.id(name)) in world.work.calls


@then(parsers.parse('task "{name}" has not run'))
def task_not_run(world: World, name: str) -> None:
    assert not any(tid == world.id(name) for _, tid in world.work.calls)


@then(parsers.parse('tasks "{names}" are "{status}"'))
@then(parsers.parse('task "{names}" is "{status}"'))
def tasks_are(world: World, names: str, status: str) -> None:
    found = world.run(world.h.get_tasks(world.ids(names)))
    assert {t.status for t in found.values()} == {status}, found


@then(parsers.parse('tasks "{names}" are marked for cancellation'))
def tasks_marked(world: World, names: str) -> None:
    found = world.run(world.h.get_tasks(world.ids(names)))
    assert all(t.abort_requested for t in found.values())


@then(parsers.parse('task "{name}" is not marked for cancellation'))
def task_not_marked(world: World, name: str) -> None:
    found = world.run(world.h.task(world.id(name)))
    assert found is not None and not found.abort_requested


@then(parsers.parse('task "{name}" waits durably for its subagent'))
def waits_for_subagent(world: World, name: str) -> None:
    task = world.run(world.h.task(world.id(name)))
    assert task is not None and isinstance(task.state, dict)
    owner = task.state["owner"]
    assert task.role == "ready" and task.after == (owner,)  # a stored dependency
    assert world.h.scheduler.executing == {}  # no effect is holding a promise


@then(parsers.parse('task "{name}" has the subagent\'s answer'))
def has_answer(world: World, name: str) -> None:
    task = world.run(world.h.task(world.id(name)))
    assert task is not None and isinstance(task.state, dict)
    assert task.state["result"] == "the subagent's answer"


# ------------------------------------------------------------------ agent turns (§8)
# The model is the faux provider; its text streams one chunk per second of a fake clock and
# tools take five seconds, so "while it works" is a deterministic state, not a race.


@dataclass
class Agent:
    provider: pico.FauxProvider
    clock: pico.FakeClock
    invoked: list[str] = field(default_factory=list)
    driving: Any = None


def _agent(world: World) -> Agent:
    agent = getattr(world, "agent", None)
    assert isinstance(agent, Agent), "the scenario has no agent session"
    return agent


def _agent_tools(agent: Agent) -> list[pico.Tool]:
    schema: pico.JsonObject = {"type": "object"}

    def make(name: str) -> Any:
        async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            agent.invoked.append(name)
            await agent.clock.sleep_until(agent.clock.now() + 5)
            return f"{name} done"

        return run

    return [pico.Tool(n, n, schema, make(n)) for n in ("read", "grep")]


@given(parsers.parse('an agent session with conversation "{name}"'), target_fixture="world")
def an_agent_session(world: World, name: str) -> World:
    clock = pico.FakeClock()
    agent = Agent(pico.FauxProvider([], chunk_chars=4, cadence=1.0, clock=clock), clock)
    world.agent = agent
    world.harness = world.run(
        world.backend.open(provider=agent.provider, tools=_agent_tools(agent), clock=clock)
    )
    world.names[name] = world.run(world.h.root()).id
    return world


@given(parsers.parse('the model will answer "{text}"'))
def model_answers(world: World, text: str) -> None:
    _agent(world).provider.script.append(text)


@given(parsers.parse('the model will call the tools "{names}"'))
def model_calls(world: World, names: str) -> None:
    calls: list[tuple[str, pico.JsonObject]] = [(n, {}) for n in _names(names)]
    _agent(world).provider.script.append(pico.FauxResponse(tool_calls=calls))


@given(
    parsers.parse("the model will be overloaded once, asking to retry after {seconds:d} seconds")
)
def model_overloaded(world: World, seconds: int) -> None:
    _agent(world).provider.script.append(
        pico.FauxFailure("retryable", "overloaded", retry_after=float(seconds))
    )


@given(parsers.parse('the model will answer "{text}" later, after {polls:d} poll'))
def model_defers(world: World, text: str, polls: int) -> None:
    _agent(world).provider.script.append(pico.FauxDeferred(polls=polls, then=text))


_ADMIT = {
    "asks": "accept",
    "steers with": "steer",
    "follows up with": "follow_up",
    "leaves for the next run": "next_run",
    "adds the message": "append_message",
}


@when(
    parsers.re(
        r"the user (?P<how>asks|steers with|follows up with|leaves for the next run|"
        r'adds the message) "(?P<text>[^"]+)" in "(?P<conv>[^"]+)"$'
    )
)
def user_input(world: World, how: str, text: str, conv: str) -> None:
    handle = world.conv(conv)
    method = getattr(handle, _ADMIT[how])
    world.names[text] = world.run(method(text))


@when(parsers.parse('"{conv}" starts working'))
def starts_working(world: World, conv: str) -> None:
    agent = _agent(world)

    async def start() -> None:
        agent.driving = asyncio.ensure_future(world.conv(conv).drive())
        for _ in range(50):
            await asyncio.sleep(0)

    world.run(start())


async def _finish(agent: Agent) -> str:
    while not agent.driving.done():
        agent.clock.advance(1.0)
        await asyncio.sleep(0)
    return str(agent.driving.result())


@when(parsers.parse('"{conv}" finishes its work'))
def finishes(world: World, conv: str) -> None:
    world.outcome = world.run(asyncio.wait_for(_finish(_agent(world)), 10))


@when(parsers.parse('"{conv}" works until it settles'))
def works_until_settled(world: World, conv: str) -> None:
    starts_working(world, conv)
    finishes(world, conv)


@when(parsers.parse('"{conv}" works until it settles with permission "{permit}"'))
def works_with_permit(world: World, conv: str, permit: str) -> None:
    agent = _agent(world)

    async def run() -> str:
        agent.driving = asyncio.ensure_future(world.conv(conv).drive(permits=[permit]))
        return await _finish(agent)

    world.outcome = world.run(asyncio.wait_for(run(), 10))


@then(parsers.parse('the answer to "{question}" is "{text}"'))
def answer_is(world: World, question: str, text: str) -> None:
    conv = pico.ConversationHandle(world.h, world.run(world.h.root()).id)
    result = world.run(conv.result(world.id(question)))
    assert result is not None and result.status == "done", result
    entry = world.run(world.h.entry(result.entry_id))
    assert entry is not None and isinstance(entry.content, dict)
    assert entry.content["text"] == text


@then(
    parsers.re(
        r'"(?P<question>[^"]+)" is (?P<status>queued|running|done|placed|cancelled|failed|stopped)$'
    )
)
def input_status(world: World, question: str, status: str) -> None:
    conv = pico.ConversationHandle(world.h, world.run(world.h.root()).id)
    result = world.run(conv.result(world.id(question)))
    assert result is not None and result.status == status, result


@then(parsers.parse('"{first}" and "{second}" share one answer'))
def share_answer(world: World, first: str, second: str) -> None:
    conv = pico.ConversationHandle(world.h, world.run(world.h.root()).id)
    a, b = (world.run(conv.result(world.id(n))) for n in (first, second))
    assert a is not None and b is not None and a.status == b.status == "done"
    assert a.entry_id == b.entry_id


@then(parsers.parse('the tools "{names}" ran'))
def tools_ran(world: World, names: str) -> None:
    assert sorted(_agent(world).invoked) == sorted(_names(names))


@then(parsers.parse('the transcript of "{conv}" has the kinds "{kinds}"'))
def transcript_kinds(world: World, conv: str, kinds: str) -> None:
    page = world.run(world.conv(conv).entries(limit=1000))
    assert [e.kind for e in page.items] == _names(kinds)


@then(parsers.parse("the model was asked {count:d} times"))
def model_asked(world: World, count: int) -> None:
    assert _agent(world).provider.request_count == count
