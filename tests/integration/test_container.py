"""Embedding through the container (issue 17): ``pico.Container`` wires storage, model
provider, tools, hooks, clock and telemetry; an embedding service declares it in its own
dependency-injector container, overrides any provider, and the harness uses the override."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from dependency_injector import containers, providers
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pico
from pico.application.telemetry import Telemetry
from pico.infrastructure.container import build_storage
from pico.infrastructure.settings import settings_for


class Service(containers.DeclarativeContainer):
    """An embedding service's own container, as docs/guide.md shows it."""

    config = providers.Configuration()
    pico = providers.Container(pico.Container, config=config.pico)


def service(url: str, **extra: Any) -> Service:
    app = Service()
    app.config.from_dict({"pico": {"storage_url": url, "session": "svc", **extra}})
    return app


async def echo(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    return f"echo {args.get('text')}"


ECHO = pico.Tool("echo", "Echo the text", {"type": "object"}, echo)


async def test_config_storage_url_and_session_are_where_the_harness_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    app = service(url)
    h = await app.pico.harness()
    try:
        assert h.session_id == "svc"
        await (await h.root()).append("user", "stored by the container's harness")
    finally:
        await h.close()
    # Check the short path (Harness.open -> open_storage, the same container) reads it back.
    async with await pico.Harness.open(url, session="svc", read_only=True) as again:
        page = await (await again.root()).entries()
        assert [e.content for e in page.items] == ["stored by the container's harness"]


async def test_a_settings_override_replaces_the_config(tmp_path: Path) -> None:
    app = service(f"sqlite:///{tmp_path / 'unused.db'}")
    target = tmp_path / "chosen.db"
    app.pico.settings.override(pico.PicoSettings(storage_url=f"sqlite:///{target}", session="s2"))
    h = await app.pico.harness()
    await h.close()
    assert h.session_id == "s2"
    assert target.exists() and not (tmp_path / "unused.db").exists()


async def test_a_storage_override_is_the_storage_the_harness_uses() -> None:
    app = service("memory://not-this-one")
    other = providers.Object(settings_for("memory://container-storage", session="elsewhere"))
    app.pico.storage.override(providers.Factory(build_storage, settings=other))
    h = await app.pico.harness()
    try:
        assert h.session_id == "elsewhere"
        await (await h.root()).append("user", "x")
    finally:
        await h.close()
    async with await pico.Harness.open("memory://container-storage", session="elsewhere") as h2:
        assert [e.content for e in (await (await h2.root()).entries()).items] == ["x"]


async def test_model_tools_and_options_overrides_reach_the_requests() -> None:
    app = service("memory://", options={"system": "be brief", "model": "house-model"})
    faux = pico.FauxProvider([pico.FauxResponse(tool_calls=[("echo", {"text": "hi"})]), "ok"])
    app.pico.model.override(faux)
    app.pico.tools.override([ECHO])
    h = await app.pico.harness()
    try:
        _, result = await (await h.root()).prompt("say hi")
        assert result is not None and result.status == "done"
        (tool,) = (await h.tasks(kind="tool")).items
        assert tool.status == "done"
        assert isinstance(tool.state, dict) and tool.state["name"] == "echo"
    finally:
        await h.close()
    # Check what the model was sent: the options' system prompt and model, the tool offered.
    first = faux.requests[0]
    assert (first.system, first.model) == ("be brief", "house-model")
    assert [spec.name for spec in first.tools] == ["echo"]
    (answer,) = [
        p.content
        for m in faux.requests[1].messages
        for p in m.parts
        if isinstance(p, pico.ToolResultPart)
    ]
    assert answer == "echo hi"


async def test_a_hooks_override_decides_the_tool_calls() -> None:
    async def block(call: pico.ToolCall) -> pico.ToolDecision:
        return pico.ToolDecision("block", "blocked by the service's hooks")

    ran: list[str] = []

    async def tracked(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        ran.append("ran")
        return "ran"

    app = service("memory://")
    app.pico.model.override(pico.FauxProvider([pico.FauxResponse(tool_calls=[("t", {})]), "done"]))
    app.pico.tools.override([pico.Tool("t", "t", {"type": "object"}, tracked)])
    app.pico.hooks.override(pico.Hooks(before_tool=block))
    h = await app.pico.harness()
    try:
        c = await h.root()
        await c.prompt("go")
        results = [e.content for e in (await c.entries(kind="tool")).items]
    finally:
        await h.close()
    assert ran == []
    assert results == [{"content": "blocked by the service's hooks", "is_error": True}]


async def test_a_clock_override_is_the_time_the_scheduler_stores() -> None:
    clock = pico.FakeClock(start=7_000.0)
    app = service("memory://")
    app.pico.clock.override(clock)
    app.pico.model.override(
        pico.FauxProvider([pico.FauxFailure("retryable", "busy", retry_after=30.0), "ok"])
    )
    h = await app.pico.harness()
    try:
        c = await h.root()
        question = await c.accept("hello")
        driving = asyncio.ensure_future(c.drive())  # waits for the retry on the fake clock
        for _ in range(200):
            await asyncio.sleep(0)
            (generation,) = (await h.tasks(kind="generation")).items
            if generation.status == "retry_wait":
                break
        # Check the stored timer is the fake clock's time plus the provider's retry_after.
        assert generation.status == "retry_wait"
        assert generation.not_before == pytest.approx(7_030.0)
        assert not driving.done()
        clock.advance(30.0)
        assert await asyncio.wait_for(driving, 5) == "idle"
        result = await c.result(question)
        assert result is not None and result.status == "done"
    finally:
        await h.close()


async def test_a_telemetry_override_records_the_spans() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = service("memory://")
    app.pico.telemetry.override(tracer_provider.get_tracer("the-service"))
    h = await app.pico.harness()
    try:
        await (await h.root()).append("user", "traced")
    finally:
        await h.close()
    spans = exporter.get_finished_spans()
    commands = [s for s in spans if s.name == "pico.command"]
    assert commands, [s.name for s in spans]
    assert all(s.instrumentation_scope.name == "the-service" for s in commands)  # type: ignore[union-attr]
    assert {s.attributes.get("pico.session.id") for s in commands} == {"svc"}  # type: ignore[union-attr]


async def test_a_telemetry_object_is_used_as_is() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = service("memory://")
    telemetry = Telemetry(tracer=tracer_provider.get_tracer("t"))
    app.pico.telemetry.override(telemetry)
    h = await app.pico.harness()
    # Check: the harness traces through the very object, not a re-wrapping of its tracer.
    assert h._line.telemetry is telemetry
    await h.close()  # opening creates the root conversation: one command
    assert [s.name for s in exporter.get_finished_spans()].count("pico.command") >= 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("settings", "sqlite:///x.db"),
        ("storage", 42),
        ("model", "gpt"),
        ("tools", "echo"),
        ("tools", [print]),
        ("hooks", {"before_tool": None}),
        ("clock", "noon"),
        ("telemetry", object()),
        ("options", ["system"]),
    ],
)
async def test_a_wrong_override_names_its_provider_and_opens_nothing(
    tmp_path: Path, name: str, value: object
) -> None:
    db = tmp_path / "never.db"
    app = service(f"sqlite:///{db}")
    getattr(app.pico, name).override(providers.Object(value))
    with pytest.raises(pico.ConfigurationError, match=f"container's '{name}' provider"):
        await app.pico.harness()
    assert not db.exists()


async def test_a_failing_provider_is_a_configuration_error_naming_it() -> None:
    def broken() -> object:
        raise RuntimeError("the vault is sealed")

    app = service("memory://")
    app.pico.model.override(providers.Factory(broken))
    with pytest.raises(pico.ConfigurationError, match=r"'model' provider failed.*vault is sealed"):
        await app.pico.harness()


async def test_an_unknown_option_is_refused_and_says_which_providers_wire_it() -> None:
    app = service("memory://", options={"clock": "x", "temprature": 0.1})
    with pytest.raises(pico.ConfigurationError, match=r"\['clock', 'temprature'\].*clock have"):
        await app.pico.harness()


async def test_a_bad_config_value_is_the_settings_configuration_error() -> None:
    app = service("mysql://nope")
    with pytest.raises(pico.ConfigurationError, match="unsupported storage URL"):
        await app.pico.harness()


async def test_the_container_needs_no_embedder_container() -> None:
    container = pico.Container()
    container.config.from_dict({"storage_url": "memory://"})
    container.model.override(pico.FauxProvider(["plain"]))
    h = await container.harness()
    try:
        assert h.session_id == "main"  # Harness.open's default session
        _, result = await (await h.root()).prompt("hi")
        assert result is not None and result.status == "done"
    finally:
        await h.close()
