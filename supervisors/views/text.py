"""Text for a terminal: what a name, a detail or a job's own progress line may not do there."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` for a terminal: control characters (ESC and the rest, but tab and newline) shown as
    `?`, so a region's, a host's or a job's text cannot move the cursor, recolour or retitle it."""
    return _CONTROL.sub("?", text)
