"""The log's WARNING lines while the live view (live.py) is on the screen.

They are not written between frames (each left a stale header behind): `View.warn`, the loguru
sink `watch` puts in place of stderr's, hands each to `Warnings.add` (from any thread); the view
folds them on its own thread into one line of the frame (how many, of how many kinds, the latest
with its job), and after the batch each kind is told once with its count and jobs
(`Warnings.summary`); the run's log has each.
"""

from __future__ import annotations

import collections
import re
from typing import Any


class Warnings:
    """WARNING lines, taken from any thread (`add`) and folded by kind on the view's (`fold`)."""

    def __init__(self) -> None:
        self.came: collections.deque[tuple[str, str]] = collections.deque()  # (job, text), from any thread
        self.kinds: dict[str, list[Any]] = {}  # kind -> [count, latest job, latest text, jobs]
        self.count = 0
        self.latest = ""

    def add(self, message: Any) -> None:
        """A loguru message (its record's job and text) or a plain string, kept for the next fold."""
        record = getattr(message, "record", None)
        job = str(record["extra"].get("job", "")) if record is not None else ""
        text = str(record["message"]) if record is not None else str(message).strip()
        self.came.append(("" if job == "-" else job, text))

    def fold(self) -> None:
        while self.came:
            job, text = self.came.popleft()
            kind = re.sub(r"\d+(\.\d+)?", "#", text)[:120]
            entry = self.kinds.setdefault(kind, [0, "", "", []])
            entry[0] += 1
            entry[1], entry[2] = job, text
            if job and job not in entry[3] and len(entry[3]) < 3:
                entry[3].append(job)
            self.count += 1
            self.latest = f"{job}: {text}" if job else text

    def frame_line(self) -> str:
        """The frame's line for the warnings folded so far (shown once there is one)."""
        kinds = len(self.kinds)
        return f"warnings: {self.count} ({kinds} kind{'s' if kinds > 1 else ''}); latest: {self.latest}"

    def summary(self) -> list[str]:
        """Each kind of warning once: how many times, an example, the first jobs it named."""
        self.fold()
        out = []
        for count, job, text, jobs in self.kinds.values():
            named = f" (jobs {', '.join(jobs)}{' and others' if count > len(jobs) else ''})" if jobs else ""
            out.append(f"WARNING x{count}: {(job + ': ') if job and count == 1 else ''}{text}{named}")
        return out


__all__ = ["Warnings"]
