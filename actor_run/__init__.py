"""actor-run: run GPU jobs on rented machines in attempts (always deleted, retried, metered)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("actor-run")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
