"""``pico.providers``: the adapters import on first use, and a missing SDK names the extra
to install instead of failing at ``import pico``."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pico.providers
from pico.infrastructure.providers.anthropic import AnthropicProvider
from pico.infrastructure.providers.openai import OpenAIProvider


def test_the_short_import_is_the_adapter() -> None:
    assert pico.providers.OpenAIProvider is OpenAIProvider
    assert pico.providers.AnthropicProvider is AnthropicProvider


@pytest.mark.parametrize(
    ("name", "sdk"), [("OpenAIProvider", "openai"), ("AnthropicProvider", "anthropic")]
)
def test_a_missing_sdk_is_a_configuration_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, name: str, sdk: str
) -> None:
    monkeypatch.setitem(sys.modules, sdk, None)  # what an uninstalled package imports as
    with pytest.raises(pico.ConfigurationError, match=rf"pip install 'pico-harness\[{sdk}\]'"):
        getattr(pico.providers, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="GeminiProvider"):
        pico.providers.GeminiProvider  # noqa: B018


def test_import_pico_loads_no_provider_sdk() -> None:
    code = (
        "import sys, pico, pico.providers; "
        "print('openai' in sys.modules, 'anthropic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
