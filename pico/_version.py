"""The installed distribution's version: pyproject.toml's ``version`` is the single source."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]

DISTRIBUTION = "pico-harness"


def package_version() -> str:
    """``pico-harness``'s version from the package metadata; ``0+unknown`` when pico runs
    from a checkout that was never installed (no metadata to read)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"
