"""Waiting on a condition another thread or process makes true (a file it writes, the ledger it
fills, a process it ends), polled and bounded: never a bare sleep.

    poll(check, timeout, what)     # check()'s first true value; AssertionError naming `what` past the bound
    settled(leftovers, timeout)    # leftovers() once empty, or what is still left past the bound
"""

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
        time.sleep(every)  # the polling period itself: this module is where tests wait
    return value


def settled(leftovers: Callable[[], T], timeout: float, every: float = 0.05) -> T:
    """`leftovers()` once it is empty (falsy), or its last value past `timeout`: what a leak check
    reports (the actors, threads or processes still there) instead of raising itself."""
    end = time.monotonic() + timeout
    while (value := leftovers()) and time.monotonic() <= end:
        time.sleep(every)  # the polling period itself
    return value
