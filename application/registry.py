"""Where ``Harness.open(url)`` finds the storage adapters.

The composition root (the ``pico`` package) registers infrastructure's opener, so the
application layer never imports infrastructure.
"""

from __future__ import annotations

from pico.application.ports import StorageOpener

__all__ = ["get_storage_opener", "set_storage_opener"]

_opener: StorageOpener | None = None


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
