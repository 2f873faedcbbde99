"""Flag: `threading.Event`'s set / is_set / wait, for the many that are set and seldom waited for.

A `threading.Event` is about eight objects the garbage collector walks (a Condition, its lock, a
deque of waiters and the bound methods it copies). Every actor has one (pykka's `actor_stopped`),
and so did each lease and ledger write: at a thousand attempts a third of what the collector walked
(bench/RESULTS.md). A Flag is one object; the Event is made only for a thread that waits.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()  # a set racing the first wait (rare: held for a few instructions)


class Flag:
    __slots__ = ("_event", "_on")

    def __init__(self) -> None:
        self._on = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._on

    def set(self) -> None:
        with _LOCK:
            self._on = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set; False if `timeout` seconds passed first."""
        with _LOCK:
            if self._on:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)
