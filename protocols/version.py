"""The installed distribution's version, read only when asked (importlib.metadata: about 50 ms of CPU)."""

from __future__ import annotations


def package_version() -> str:
    """actor-run's version as installed, or "0+unknown" for a source tree never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("actor-run")
    except PackageNotFoundError:
        return "0+unknown"
