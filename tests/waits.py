"""Waiting on a condition another process makes true (a file it writes, the ledger it fills),
polled and bounded: never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(check: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> T:
    """`check()`'s first true value, polled every `every` s; AssertionError naming `what` past `timeout`."""
    end = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
    return value
