"""The resume gate (seed 000, issue 13): a session opened for agent work records the
configuration fingerprint its work is written under; a reopen under a different one
behaves per field class (hard, blocking, tools, budget) and every accepted change is an
event an auditor sees. Every test runs on every backend."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

import pico
from pico import FauxFailure, FauxProvider, FauxResponse, ToolContext
from pico.application.gate import FIELDS, fingerprint
from pico.application.hooks import ToolCall, ToolDecision
from pico.domain.json import JsonObject
from tests.backends import Backend

PATH: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}
TARGET: JsonObject = {
    "type": "object",
    "properties": {"target": {"type": "string"}},
    "required": ["target"],
}


def _events(h: pico.Harness, after: int = 0) -> list[Any]:
    """The stored events (their payloads read as Any: the tests index them)."""
    return h.audit(after=after, limit=100_000)


def _json(value: object) -> Any:
    """A stored JSON value, read as Any (the tests index into it)."""
    return value


def _of(h: pico.Harness, event: str, after: int = 0) -> list[Any]:
    return [r for r in _events(h, after) if r.event == event]


def _last(h: pico.Harness) -> int:
    records = _events(h)
    return records[-1].position if records else 0


class TunedProvider(FauxProvider):
    """A provider exposing its options through ``fingerprint()``."""

    def __init__(self, script: Any, *, temperature: float) -> None:
        super().__init__(script)
        self.temperature = temperature

    def fingerprint(self) -> JsonObject:
        return {"temperature": self.temperature}


class OtherProvider(FauxProvider):
    """Another provider class (not part of the fingerprint: only its model counts)."""


async def _bounded(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, 10)


async def test_the_first_open_for_agent_work_records_the_fingerprint(backend: Backend) -> None:
    tool = pico.Tool("read", "Read a file", PATH, _never)
    h = await backend.open(
        provider=FauxProvider([]), tools=[tool], model="m1", system="secret prompt"
    )
    (recorded,) = _of(h, "Session.ConfigurationRecorded")
    fp = recorded.payload["fingerprint"]
    assert fp == h.configuration()
    assert (
        fp["model"] == "m1"
        and fp["provider_options"] == "sha256:" + hashlib.sha256(b"{}").hexdigest()
    )
    assert fp["system"] == "sha256:" + hashlib.sha256(b"secret prompt").hexdigest()
    assert fp["max_attempts"] == 3 and fp["retry_delay"] == 2.0 and fp["context_budget"] is None
    assert str(fp["tool:read"]).startswith("sha256:")
    # The prompt is never stored verbatim, anywhere in the log.
    assert all("secret prompt" not in repr(r.payload) for r in _events(h))
    # It lands in the claim's batch, before the claim: it allocates no number.
    claims = _of(h, "Session.Claimed")
    assert recorded.position == claims[0].position - 1
    await h.close()


async def test_the_same_configuration_reopens_without_a_new_event(backend: Backend) -> None:
    config: dict[str, Any] = {"model": "m1", "system": "be brief", "max_attempts": 2}
    h = await backend.open(provider=FauxProvider([]), **config)
    head, last = h.head(), _last(h)
    await h.close()
    h = await backend.open(provider=FauxProvider([]), **config)
    assert [r.event for r in _events(h, last)] == ["Session.Claimed"]  # only the claim
    assert h.head() == head and h.pending_configuration() == []
    await h.close()


@pytest.mark.parametrize(
    ("change", "field"),
    [({"model": "m2"}, "model"), ({"provider": OtherProvider([]), "model": "m3"}, "model")],
)
async def test_a_hard_change_refuses_to_resume_and_writes_nothing(
    backend: Backend, change: dict[str, Any], field: str
) -> None:
    h = await backend.open(provider=FauxProvider([]), model="m1")
    recorded = h.configuration()
    await h.close()
    h = await backend.open(read_only=True)
    before = (h.head(), h.audit_count(), _last(h))
    await h.close()
    with pytest.raises(pico.ConfigurationMismatchError) as caught:
        await backend.open(**{"provider": FauxProvider([]), "model": "m1", **change})
    # Another provider class with the recorded model is not a change.
    h = await backend.open(provider=OtherProvider([]), model="m1")
    assert h.pending_configuration() == [] and h.configuration() == recorded
    await h.close()
    h = await backend.open(read_only=True)
    before = (h.head(), h.audit_count(), _last(h))
    await h.close()
    assert caught.value.hard
    assert [c["field"] for c in caught.value.changes] == [field]
    assert caught.value.changes[0]["class"] == "hard" == FIELDS[field]
    message = str(caught.value)
    assert field in message and "nothing was written" in message and "new session" in message
    assert str(_json(recorded)[field]) in message
    h = await backend.open(read_only=True)
    assert (h.head(), h.audit_count(), _last(h)) == before  # not even the claim
    await h.close()
    # The recorded configuration still opens: its claim is the only new event.
    h = await backend.open(provider=FauxProvider(["hello"]), model="m1")
    assert h.configuration() == recorded
    assert [r.event for r in _events(h, before[2])] == ["Session.Claimed"]
    assert h.head() == before[0]
    c = await h.root()
    _, result = await _bounded(c.prompt("hi"))
    assert result is not None and result.status == "done"
    await h.close()


async def test_a_changed_system_prompt_drives_nothing_until_acknowledged(
    backend: Backend,
) -> None:
    h = await backend.open(provider=FauxProvider([]), system="first prompt")
    recorded = h.configuration()
    await h.close()
    provider = FauxProvider(["an answer"])
    h = await backend.open(provider=provider, system="second prompt")
    last = _last(h)
    assert [c["field"] for c in h.pending_configuration()] == ["system"]
    assert h.configuration() == recorded  # nothing recorded yet
    c = await h.root()
    input_id = await c.accept("hello")  # public commands still work
    with pytest.raises(pico.ConfigurationMismatchError) as caught:
        await c.drive()
    assert not caught.value.hard and "acknowledge_configuration" in str(caught.value)
    with pytest.raises(pico.ConfigurationMismatchError):
        await h.drive()
    assert provider.request_count == 0  # the provider got no request
    assert _of(h, "Session.ConfigurationChanged", last) == []
    changes = await h.acknowledge_configuration()
    assert [c["field"] for c in changes] == ["system"]
    (changed,) = _of(h, "Session.ConfigurationChanged", last)
    assert changed.payload["acknowledged"] is True
    assert changed.payload["changes"] == changes
    assert h.configuration() == changed.payload["fingerprint"] != recorded
    assert await _bounded(c.drive()) == "idle"
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    assert [r.system for r in provider.requests] == ["second prompt"]
    assert await h.acknowledge_configuration() == []  # nothing left: writes nothing
    await h.close()
    h = await backend.open(provider=FauxProvider([]), system="second prompt")
    assert h.pending_configuration() == []  # the acknowledged prompt is the recorded one
    await h.close()


async def test_an_unacknowledged_change_records_nothing_and_the_old_configuration_resumes(
    backend: Backend,
) -> None:
    h = await backend.open(provider=TunedProvider([], temperature=0.2), tool_execution="parallel")
    await h.close()
    h = await backend.open(provider=TunedProvider([], temperature=0.7), tool_execution="sequential")
    assert {c["field"]: c["class"] for c in h.pending_configuration()} == {
        "provider_options": "blocking",
        "tool_execution": "blocking",
    }
    await h.close()
    h = await backend.open(provider=TunedProvider([], temperature=0.2))
    assert h.pending_configuration() == []
    assert _of(h, "Session.ConfigurationChanged") == []
    # Stored as a hash only (a provider's options may name an endpoint or an account).
    expected = hashlib.sha256(b'{"temperature":0.2}').hexdigest()
    assert _json(h.configuration())["provider_options"] == f"sha256:{expected}"
    await h.close()


async def _never(args: JsonObject, ctx: ToolContext) -> str:
    raise AssertionError("this tool must not run")


async def test_a_removed_tool_gives_an_error_result_naming_it(backend: Backend) -> None:
    async def ask(args: JsonObject, ctx: ToolContext) -> str:
        ctx.defer()  # answered from outside later
        return "asked"

    ran: list[str] = []

    async def write(args: JsonObject, ctx: ToolContext) -> str:
        ran.append("write")
        return "written"

    calls = FauxResponse(tool_calls=[("ask", {"path": "a"}), ("write", {"path": "b"})])
    tools = [pico.Tool("ask", "Ask", PATH, ask), pico.Tool("write", "Write", PATH, write)]
    h = await backend.open(provider=FauxProvider([calls]), tools=tools, tool_execution="sequential")
    c = await h.root()
    await c.accept("go")
    assert await _bounded(c.drive()) == "suspended"  # ask is held; write waits after it
    (held,) = await h.held_tool_calls()
    await h.close()
    provider = FauxProvider(["done"])
    h = await backend.open(provider=provider, tools=tools[:1], tool_execution="sequential")
    (changed,) = _of(h, "Session.ConfigurationChanged")  # accepted at once, recorded
    assert changed.payload["acknowledged"] is False
    assert [(x["field"], x["class"], x["after"]) for x in changed.payload["changes"]] == [
        ("tool:write", "tools", None)
    ]
    await h.answer_tool_call(held.id, "the answer")
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    results = (await h.entries(c.id, kind="tool")).items
    by_name = {_json(r.metadata)["tool_name"]: _json(r.content) for r in results}
    assert by_name["write"]["is_error"] is True
    assert "'write' is no longer offered" in by_name["write"]["content"]
    assert ran == []
    assert len(provider.requests) == 1
    await h.close()


async def _hold(call: ToolCall) -> ToolDecision:
    return ToolDecision("hold", "needs a human")


async def test_a_renamed_tool_is_never_invoked_in_its_place(backend: Backend) -> None:
    ran: list[str] = []

    async def lookup(args: JsonObject, ctx: ToolContext) -> str:
        ran.append(ctx.tool_name)
        return "found"

    calls = FauxResponse(tool_calls=[("lookup", {"path": "a"})])
    hooks = pico.Hooks(before_tool=_hold)
    h = await backend.open(
        provider=FauxProvider([calls]),
        tools=[pico.Tool("lookup", "Look", PATH, lookup)],
        hooks=hooks,
    )
    c = await h.root()
    await c.accept("go")
    await _bounded(c.drive())
    (approval,) = await h.pending_approvals()
    await h.close()
    renamed = pico.Tool("find", "Look", PATH, lookup)
    h = await backend.open(provider=FauxProvider(["ok"]), tools=[renamed], hooks=hooks)
    (changed,) = _of(h, "Session.ConfigurationChanged")  # a rename: one removed, one added
    assert [x["field"] for x in changed.payload["changes"]] == ["tool:find", "tool:lookup"]
    await h.decide_approval(approval.id, "grant")
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    (result,) = (await h.entries(c.id, kind="tool")).items
    assert _json(result.content)["is_error"] is True
    assert "'lookup' is no longer offered" in _json(result.content)["content"]
    assert ran == []  # "find" was never invoked in its place
    await h.close()


async def test_a_changed_schema_validates_arguments_against_the_new_schema(
    backend: Backend,
) -> None:
    calls = FauxResponse(tool_calls=[("edit", {"path": "a"})])
    h = await backend.open(
        provider=FauxProvider([calls]),
        tools=[pico.Tool("edit", "Edit", PATH, _never)],
        hooks=pico.Hooks(before_tool=_hold),
    )
    c = await h.root()
    await c.accept("go")
    await _bounded(c.drive())
    (approval,) = await h.pending_approvals()
    await h.close()
    h = await backend.open(
        provider=FauxProvider(["ok"]), tools=[pico.Tool("edit", "Edit", TARGET, _never)]
    )
    (changed,) = _of(h, "Session.ConfigurationChanged")
    assert [x["field"] for x in changed.payload["changes"]] == ["tool:edit"]
    await h.decide_approval(approval.id, "grant")
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    (result,) = (await h.entries(c.id, kind="tool")).items
    assert _json(result.content)["is_error"] is True
    assert "'target' is a required property" in _json(result.content)["content"]
    await h.close()


async def _until_retry_wait(h: pico.Harness, cid: int) -> pico.TaskSnapshot:
    for _ in range(200):
        await asyncio.sleep(0)
        page = await h.tasks(conversation_ids=[cid], kind="generation")
        if page.items and page.items[0].status == "retry_wait":
            return page.items[0]
    raise AssertionError("the generation never waited for a retry")


@pytest.mark.parametrize(("failures", "status"), [(3, "done"), (4, "failed")])
async def test_a_larger_retry_budget_applies_to_new_attempts_only(
    backend: Backend, failures: int, status: str
) -> None:
    """Created under max_attempts=2 with one attempt made; reopened with 4: the attempt
    made stays counted, so 3 more may follow (4 in all), not 4 more."""
    clock = pico.FakeClock()
    busy = FauxFailure("retryable", "busy")
    first = FauxProvider([busy])
    h = await backend.open(provider=first, clock=clock, max_attempts=2, retry_delay=10.0)
    c = await h.root()
    input_id = await c.accept("hello")
    driving = asyncio.ensure_future(c.drive())
    generation = await _until_retry_wait(h, c.id)
    assert _json(generation.state)["max_attempts"] == 2 and _json(generation.state)["attempt"] == 1
    await h.close()
    assert await driving == "closed"
    later = FauxProvider([busy] * (failures - 1) + ["ok"])
    h = await backend.open(provider=later, clock=clock, max_attempts=4, retry_delay=0.0)
    (changed,) = _of(h, "Session.ConfigurationChanged")
    assert {x["field"]: (x["before"], x["after"]) for x in changed.payload["changes"]} == {
        "max_attempts": (2, 4),
        "retry_delay": (10.0, 0.0),
    }
    recaptured = await h.task(generation.id)
    assert recaptured is not None
    assert _json(recaptured.state)["max_attempts"] == 4 and _json(recaptured.state)["attempt"] == 1
    clock.advance(10.0)  # the retry timed under the old delay keeps its time
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    assert (await c.result(input_id)).status == status  # type: ignore[union-attr]
    assert later.request_count == 3  # attempts 2, 3 and 4: the first stays counted
    await h.close()


async def test_a_resume_reminder_never_changes_the_fingerprint(backend: Backend) -> None:
    h = await backend.open(provider=FauxProvider([]), system="the prompt", resume_reminder="R")
    recorded = h.configuration()
    assert h.services is not None and h.services.system == "the prompt"  # not resuming
    await h.close()
    provider = FauxProvider(["ok"])
    h = await backend.open(provider=provider, system="the prompt", resume_reminder="resumed")
    assert h.configuration() == recorded and h.pending_configuration() == []
    assert _of(h, "Session.ConfigurationChanged") == []
    c = await h.root()
    await _bounded(c.prompt("hi"))
    assert [r.system for r in provider.requests] == ["the prompt\n\nresumed"]
    await h.close()


async def test_plain_and_read_only_opens_are_never_gated(backend: Backend) -> None:
    h = await backend.open()  # no provider: a plain conversation store
    assert h.configuration() is None
    assert _of(h, "Session.ConfigurationRecorded") == []
    await h.close()
    h = await backend.open(provider=FauxProvider([]), model="m1")
    await h.close()
    h = await backend.open(read_only=True, provider=FauxProvider([]), model="m2")
    assert _json(h.configuration())["model"] == "m1"
    await h.close()
    h = await backend.open()  # a plain reopen neither checks nor records
    assert _json(h.configuration())["model"] == "m1"
    await h.close()


async def test_the_fingerprint_classes_every_field_in_one_table(backend: Backend) -> None:
    h = await backend.open(provider=FauxProvider([]), context_budget=500)
    assert h.services is not None
    fp = fingerprint(h.services)
    assert fp["context_budget"] == 500
    assert {("tool:*" if k.startswith("tool:") else k) for k in fp} <= FIELDS.keys()
    assert set(FIELDS.values()) == {"hard", "blocking", "tools", "budget"}
    await h.close()


@pytest.mark.parametrize(
    ("option", "value"), [("context_budget", 0), ("context_budget", True), ("resume_reminder", 1)]
)
async def test_bad_gate_options_are_refused_before_anything_opens(
    backend: Backend, option: str, value: object
) -> None:
    with pytest.raises(pico.InvalidArgumentError, match=option):
        await backend.open(provider=FauxProvider([]), **{option: value})  # type: ignore[arg-type]
