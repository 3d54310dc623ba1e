"""Whether the default telemetry records (issue 18, fourteenth pass): without an SDK it
asks the OpenTelemetry proxy nothing per span; the answer must still follow the proxy's
own decision, before and after a provider is installed."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from pico.application.telemetry import Telemetry


def test_no_provider_means_untraced_and_a_provider_set_later_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    telemetry = Telemetry()
    proxy = telemetry.tracer
    assert isinstance(proxy, trace.ProxyTracer)
    assert telemetry._untraced()
    # A provider installed after the harness opened: the proxy now forwards to it.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert not telemetry._untraced()
    assert proxy._real_tracer is not None  # the proxy's own lookup ran and kept it
    # With a real tracer kept, no provider global is consulted again.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert not telemetry._untraced()


def _proxy_says_untraced(telemetry: Telemetry) -> bool:
    """The decision the shortcut stands for: the proxy's own ``_tracer`` is the no-op one."""
    return isinstance(getattr(telemetry.tracer, "_tracer", None), trace.NoOpTracer)


@pytest.mark.parametrize("provider", [None, "no-op", "sdk"])
def test_the_shortcut_agrees_with_the_proxys_own_decision(
    monkeypatch: pytest.MonkeyPatch, provider: str | None
) -> None:
    installed = {None: None, "no-op": trace.NoOpTracerProvider(), "sdk": TracerProvider()}
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", installed[provider])
    telemetry = Telemetry()
    assert telemetry._untraced() == _proxy_says_untraced(telemetry)
    assert telemetry._untraced() == (provider is None)  # a no-op provider: no proxy to ask
    explicit = Telemetry(tracer=TracerProvider().get_tracer("t"))
    assert not explicit._untraced()
