"""Logging that fits the host: every record goes through the standard library's `logging`, under the
`actor_run` logger tree (one logger per module: `actor_run.actors.lease`, ...), with what it is about
as fields of the record (`job`, `attempt`, and where known `actor`, `host`, `cloud`, `machine`,
`run`), so an embedding host's handlers, levels and formatters apply. The `actor_run` logger has a
NullHandler: nothing is printed by itself where the host configured nothing. The CLI forwards
these records into loguru for its own look (supervisors/cli/console.py).

Call sites read as with loguru: `logger.bind(job=key).warning("offers for {} failed: {}", c, e)`.
The message is formatted (`str.format`) only when a handler asks for it, and nothing is done at
all below the logger's level. The logger's name is the calling module's (as loguru's `name`).
Any thread may log.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

ROOT = "actor_run"
_FIELDS = ("job", "attempt")  # always on a record of ours ("-" when not about one), so a format may name them

logging.getLogger(ROOT).addHandler(logging.NullHandler())


class _Message:
    """A `{}`-style message and its arguments, formatted when first read (`LogRecord.getMessage`)."""

    __slots__ = ("args", "fmt", "kwargs")

    def __init__(self, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fmt, self.args, self.kwargs = fmt, args, kwargs

    def __str__(self) -> str:
        if not self.args and not self.kwargs:
            return self.fmt
        return self.fmt.format(*self.args, **self.kwargs)


class Logger:
    """loguru's calling convention over `logging`: `bind(**fields)` returns a logger that adds them
    to every record; `debug`/`info`/`warning`/`error`/`critical`/`exception`/`log(level, ...)`."""

    __slots__ = ("_extra", "_name")

    def __init__(self, name: str | None = None, extra: dict[str, Any] | None = None) -> None:
        self._name = name  # None: the calling module's
        self._extra = extra or {}

    def bind(self, **fields: Any) -> Logger:
        return Logger(self._name, {**self._extra, **fields})

    def _log(self, level: int, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any],
             exc_info: Any = None) -> None:
        name = self._name
        if name is None:
            name = sys._getframe(2).f_globals.get("__name__", ROOT)
            if not name.startswith(ROOT):
                name = ROOT
        target = logging.getLogger(name)
        if not target.isEnabledFor(level):
            return
        extra = {f: "-" for f in _FIELDS}
        extra.update(self._extra)
        target.log(level, _Message(fmt, args, kwargs), exc_info=exc_info, extra=extra, stacklevel=3)

    def debug(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        self._log(logging.DEBUG, fmt, args, kwargs)

    def info(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        self._log(logging.INFO, fmt, args, kwargs)

    def warning(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        self._log(logging.WARNING, fmt, args, kwargs)

    def error(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        self._log(logging.ERROR, fmt, args, kwargs)

    def critical(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        self._log(logging.CRITICAL, fmt, args, kwargs)

    def exception(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        """An ERROR with the exception being handled attached (call it in an `except` block)."""
        self._log(logging.ERROR, fmt, args, kwargs, exc_info=True)

    def log(self, level: str | int, fmt: str, *args: Any, **kwargs: Any) -> None:
        number = level if isinstance(level, int) else logging.getLevelName(level)
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        self._log(number, fmt, args, kwargs)


logger = Logger()

__all__ = ["ROOT", "Logger", "logger"]
