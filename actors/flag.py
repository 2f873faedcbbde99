"""Flag: `threading.Event`'s set / is_set / wait, for the many that are set and seldom waited for.

A `threading.Event` is about eight objects the garbage collector walks (a Condition, its lock, a
deque of waiters and the bound methods it copies). Every actor has one (pykka's `actor_stopped`),
and so did each lease and ledger write: at a thousand attempts a third of what the collector walked
(bench/RESULTS.md). A Flag is one object; the Event is made only for a thread that waits.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()  # two threads making the first wait's Event (rare)


class Flag:
    __slots__ = ("_event", "_on")

    def __init__(self) -> None:
        self._on = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._on

    def set(self) -> None:
        # no lock: `_on` is written before `_event` is read, and `wait` publishes its Event before
        # it reads `_on` again, so either this sees the Event or that wait sees the flag
        self._on = True
        event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set; False if `timeout` seconds passed first."""
        if self._on:
            return True
        with _LOCK:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._on:  # set before the Event was there to be set
            return True
        return event.wait(timeout)
