"""Where ``Harness.open(url)`` finds the storage adapters and the process host.

The composition root (the ``pico`` package) registers infrastructure's opener and its
``ProcessHost`` factory, so the application layer never imports infrastructure.
"""

from __future__ import annotations

from collections.abc import Callable

from pico.application.host import ProcessHost
from pico.application.ports import StorageOpener

__all__ = [
    "get_host_factory",
    "get_storage_opener",
    "set_host_factory",
    "set_storage_opener",
]

_opener: StorageOpener | None = None
_host_factory: Callable[[], ProcessHost] | None = None


def set_storage_opener(opener: StorageOpener) -> None:
    global _opener
    _opener = opener


def get_storage_opener() -> StorageOpener:
    if _opener is None:
        raise RuntimeError(
            "no storage opener is registered: import pico (not pico.application alone) or "
            "pass a Storage object to Harness.open"
        )
    return _opener


def set_host_factory(factory: Callable[[], ProcessHost]) -> None:
    """How a harness opened without ``host=`` makes its process host (on first use)."""
    global _host_factory
    _host_factory = factory


def get_host_factory() -> Callable[[], ProcessHost] | None:
    return _host_factory
