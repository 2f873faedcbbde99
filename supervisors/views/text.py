"""Text for a terminal: what a name, a detail, a job's own progress line or its log may not do there.

A job's bytes (its log, its progress keys and values, a provider's detail) can hold escape sequences:
OSC 52 writes the clipboard, `ESC [2J` clears the screen, `ESC ]0;...BEL` retitles the window. They
are shown, never obeyed: each control character but tab, newline (and, in a log, carriage return)
is written as its escape (`\\x1b`), so the sequence is readable and inert.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LOG_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # a log keeps its \r (progress bars)


def _shown(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def printable(text: str) -> str:
    """`text` for a terminal: control characters (ESC, C1, CR and the rest, but tab and newline)
    shown as `\\x1b`, so a region's, a host's or a job's text cannot move the cursor, recolour,
    retitle the terminal or write its clipboard."""
    return _CONTROL.sub(_shown, text)


def visible(data: bytes) -> bytes:
    """A job's log bytes for a terminal: UTF-8 kept, each control character but tab, newline and
    carriage return shown as `\\x1b`, bytes that are not UTF-8 as `\\xff`."""
    text = data.decode("utf-8", errors="backslashreplace")
    return _LOG_CONTROL.sub(_shown, text).encode("utf-8")


class PrintableStream:
    """A text stream whose every write goes through `printable` (a command's tables on stdout)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


@contextlib.contextmanager
def printable_stdout(on: bool = True) -> Iterator[None]:
    """While the block runs, sys.stdout is a PrintableStream over what it was (`on`); put back after."""
    if not on:
        yield
        return
    before = sys.stdout
    sys.stdout = PrintableStream(before)
    try:
        yield
    finally:
        sys.stdout = before
