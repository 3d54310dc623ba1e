"""The real model providers, each on its vendor's official SDK (an optional extra):

    pip install 'pico-harness[openai]'      # from pico.providers import OpenAIProvider
    pip install 'pico-harness[anthropic]'   # from pico.providers import AnthropicProvider

Imported on first use, so ``import pico`` never needs an SDK; a missing SDK is a
``ConfigurationError`` that names the extra to install. See docs/providers.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pico.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from pico.infrastructure.providers.anthropic import AnthropicProvider
    from pico.infrastructure.providers.openai import OpenAIProvider

__all__ = ["AnthropicProvider", "OpenAIProvider"]

#: Each adapter: (its module, the SDK it needs, the extra that installs it).
_ADAPTERS = {
    "OpenAIProvider": ("pico.infrastructure.providers.openai", "openai", "openai"),
    "AnthropicProvider": ("pico.infrastructure.providers.anthropic", "anthropic", "anthropic"),
}


def __getattr__(name: str) -> Any:
    if name not in _ADAPTERS:
        raise AttributeError(f"module 'pico.providers' has no attribute {name!r}")
    module, sdk, extra = _ADAPTERS[name]
    try:
        importlib.import_module(sdk)
    except ImportError as exc:
        raise ConfigurationError(
            f"{name} needs the {sdk!r} package, which is not installed: "
            f"pip install 'pico-harness[{extra}]'"
        ) from exc
    return getattr(importlib.import_module(module), name)
