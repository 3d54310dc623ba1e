"""Steps for pico.testing and pico.Container (issue 17): a test rig on the scenario's
backend, and an embedding service's own dependency-injector container."""

from __future__ import annotations

from typing import Any

from dependency_injector import containers, providers
from pytest_bdd import given, parsers, then, when

import pico
import pico.testing
from features.steps.library import World

ORDERS = {"A-1": "shipped"}


async def _order_status(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    order = str(args["order"])
    if order not in ORDERS:
        raise KeyError(f"no order {order}")
    return f"{order} is {ORDERS[order]}"


TOOLS = {
    "order_status": pico.Tool("order_status", "Look an order up", {"type": "object"}, _order_status)
}


class _Service(containers.DeclarativeContainer):
    config = providers.Configuration()
    pico = providers.Container(pico.Container, config=config.pico)


def _rig(world: World) -> pico.testing.Rig:
    rig: pico.testing.Rig | None = getattr(world, "rig", None)
    assert rig is not None, "the scenario has no test rig"
    return rig


def _rows(text: str) -> list[tuple[str, str]]:
    rows = []
    for part in text.split(" | "):
        kind, _, body = part.partition(": ")
        rows.append((kind.strip(), body.strip()))
    return rows


@given(parsers.parse('a test rig with the tool "{name}" and a scripted model'))
def ts_a_test_rig(world: World, name: str) -> None:
    async def enter() -> pico.testing.Rig:
        rig = await pico.testing.open_rig(
            tools=[TOOLS[name]], storage=world.backend.url, session=world.backend.session
        )
        world.others.append(rig.harness)  # closed with the scenario
        return rig

    world.rig = world.run(enter())  # type: ignore[attr-defined]
    world.rig_start = world.rig.clock.now()  # type: ignore[attr-defined]


@given(parsers.parse('the scripted model will look up order "{order}" and then answer "{answer}"'))
def ts_model_looks_up(world: World, order: str, answer: str) -> None:
    _rig(world).script(pico.FauxResponse(tool_calls=[("order_status", {"order": order})]), answer)


@given(parsers.parse('the scripted model will answer "{answer}"'))
def ts_model_answers(world: World, answer: str) -> None:
    _rig(world).script(answer)


@given(
    parsers.parse(
        'the scripted model is rate limited for {seconds:d} seconds and then answers "{answer}"'
    )
)
def ts_model_rate_limited(world: World, seconds: int, answer: str) -> None:
    _rig(world).script(pico.FauxFailure("retryable", "rate limited", retry_after=seconds), answer)


@when(parsers.parse('the test runs the turn "{prompt}"'))
def ts_runs_turn(world: World, prompt: str) -> None:
    rig = _rig(world)
    world.rig_result = world.run(rig.turn(prompt))  # type: ignore[attr-defined]


@then(parsers.parse('the rig\'s turn is "{status}"'))
def ts_turn_is(world: World, status: str) -> None:
    result: pico.InputResult = world.rig_result  # type: ignore[attr-defined]
    assert result.status == status, result


@then(parsers.parse('the rig\'s transcript is "{rows}"'))
def ts_transcript_is(world: World, rows: str) -> None:
    world.run(_rig(world).assert_transcript(_rows(rows)))


@then(parsers.parse('the rig\'s tool results are "{results}"'))
def ts_tool_results_are(world: World, results: str) -> None:
    expected = []
    for part in results.split(" | "):
        name, _, body = part.partition(": ")
        error = body.endswith(" (error)")
        expected.append((name, body.removesuffix(" (error)"), error))
    world.run(_rig(world).assert_tool_results(expected))


@then(parsers.parse('expecting the transcript "{rows}" fails showing "{removed}" and "{added}"'))
def ts_expecting_fails(world: World, rows: str, removed: str, added: str) -> None:
    try:
        world.run(_rig(world).assert_transcript(_rows(rows)))
    except AssertionError as exc:
        lines = str(exc).splitlines()
        assert removed in lines and added in lines, str(exc)
    else:
        raise AssertionError("the wrong expectation passed")


@then(parsers.parse("the rig's clock moved {seconds:d} seconds"))
def ts_clock_moved(world: World, seconds: int) -> None:
    moved = _rig(world).clock.now() - world.rig_start  # type: ignore[attr-defined]
    assert moved == seconds, moved


@then(parsers.parse("the scripted model was asked {count:d} times"))
def ts_model_asked(world: World, count: int) -> None:
    assert len(_rig(world).requests) == count


@given(parsers.parse('a service container whose model answers "{answer}" and whose clock is fake'))
def ts_service_container(world: World, answer: str) -> None:
    service = _Service()
    options: dict[str, Any] = {"system": "Be brief."}
    service.config.from_dict(
        {
            "pico": {
                "storage_url": world.backend.url,
                "session": world.backend.session,
                "options": options,
            }
        }
    )
    world.service_model = pico.FauxProvider([answer])  # type: ignore[attr-defined]
    service.pico.model.override(world.service_model)  # type: ignore[attr-defined]
    service.pico.clock.override(pico.FakeClock())
    world.service = service  # type: ignore[attr-defined]


@when(parsers.parse('the service opens its harness and the user asks "{prompt}"'))
def ts_service_asks(world: World, prompt: str) -> None:
    async def ask() -> pico.InputResult | None:
        harness = await world.service.pico.harness()  # type: ignore[attr-defined]
        world.others.append(harness)
        result: pico.InputResult | None
        _, result = await (await harness.root()).prompt(prompt)
        return result

    world.service_result = world.run(ask())  # type: ignore[attr-defined]


@then(parsers.parse('the service\'s answer is "{answer}"'))
def ts_service_answer(world: World, answer: str) -> None:
    result: pico.InputResult | None = world.service_result  # type: ignore[attr-defined]
    assert result is not None and result.status == "done" and result.entry_id is not None
    harness = world.others[-1]
    entry = world.run(harness.entry(result.entry_id))
    assert entry is not None and entry.content == {"text": answer}, entry


@then(parsers.parse('the service\'s model was sent the system prompt "{system}"'))
def ts_service_system(world: World, system: str) -> None:
    model: pico.FauxProvider = world.service_model  # type: ignore[attr-defined]
    assert [r.system for r in model.requests] == [system]


@when(parsers.parse('the service overrides its clock with "{value}"'))
def ts_service_overrides_clock(world: World, value: str) -> None:
    world.service.pico.clock.override(value)  # type: ignore[attr-defined]


@then(
    parsers.parse('opening the service\'s harness fails with a configuration error naming "{name}"')
)
def ts_service_open_fails(world: World, name: str) -> None:
    try:
        harness = world.run(world.service.pico.harness())  # type: ignore[attr-defined]
    except pico.ConfigurationError as exc:
        assert f"container's {name!r} provider" in str(exc), str(exc)
    else:
        world.others.append(harness)
        raise AssertionError("the wrong override opened a harness")
