"""Blocking calls off a trio thread, on threads of our own that end when the last holder lets go.

trio's `to_thread.run_sync` keeps its idle worker threads for about 10 s after use, process-wide:
a Runner closed by an embedding host left them behind. `to_thread` here is the same call on
`OFFLOAD`, a small cache of threads named `actor-run-io-N`: an idle one waits up to `idle_s` for
more work while some holder (a running reactor: `hold`/`release`) needs it, and ends at once when
none does; `release` of the last holder wakes the idle ones and joins every worker. At most 40
calls of one trio run are in threads at once (trio's own default limit).

Threads: `fn` runs on a worker thread in a copy of the caller's context; its result or exception
comes back to the trio task through the run's token. A trio cancellation waits for `fn` to end
(it cannot be interrupted), unless `abandon_on_cancel`: then the caller goes on at once and the
result is dropped.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")
LIMIT = 40  # threads one trio run may use at once (trio's default CapacityLimiter)
_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("actor_run_offload_limiter")


class ThreadCache:
    """Worker threads for blocking calls; see the module's docstring."""

    def __init__(self, name: str = "actor-run-io", idle_s: float = 2.0) -> None:
        self.name, self.idle_s = name, idle_s
        self._cond = threading.Condition()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._idle = 0
        self._holders = 0
        self._threads: set[threading.Thread] = set()
        self._ids = itertools.count()

    def hold(self) -> None:
        """Someone (a reactor) will use the cache: idle workers wait `idle_s` before they end."""
        with self._cond:
            self._holders += 1

    def release(self, timeout: float = 30.0) -> None:
        """One holder less; the last one ends the idle workers and joins every worker (each busy one
        once its call ends, up to `timeout` s in all). Any thread but a worker of this cache."""
        with self._cond:
            self._holders = max(0, self._holders - 1)
            if self._holders:
                return
            self._cond.notify_all()
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for t in threads:
            t.join(timeout)

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job()` on a worker (a free one, else a new one)."""
        with self._cond:
            self._jobs.append(job)
            if self._idle > len(self._jobs) - 1:
                self._cond.notify()
                return
            t = threading.Thread(target=self._work, name=f"{self.name}-{next(self._ids)}", daemon=True)
            self._threads.add(t)
        t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs:
                    if self._holders == 0 or (not self._cond.wait(self.idle_s) and not self._jobs):
                        self._idle -= 1
                        self._threads.discard(me)
                        return
                self._idle -= 1
                job = self._jobs.popleft()
            job()

    def statistics(self) -> dict[str, int]:
        with self._cond:
            return {"threads": len(self._threads), "idle": self._idle, "holders": self._holders}


OFFLOAD = ThreadCache()


def _run_limiter() -> trio.CapacityLimiter:
    try:
        return _limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(LIMIT)
        _limiter.set(limiter)
        return limiter


async def to_thread(fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
    """`fn(*args)` on a thread of `OFFLOAD`, awaited from a trio task: its value or its exception."""
    async with _run_limiter():
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        abandoned = False

        def wake(result: outcome.Outcome[T]) -> None:  # on the trio thread
            if not abandoned:
                trio.lowlevel.reschedule(task, result)

        def job() -> None:  # on the worker
            result = outcome.capture(call)
            with contextlib.suppress(trio.RunFinishedError):  # the trio run is gone: nobody waits
                token.run_sync_soon(wake, result)

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal abandoned
            if abandon_on_cancel:
                abandoned = True
                return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED

        await trio.lowlevel.checkpoint_if_cancelled()
        OFFLOAD.submit(job)
        value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return value


class Resolver(trio.abc.HostnameResolver):
    """trio's name lookups (`getaddrinfo` of a name that is not an address) on our threads, not its
    own: set by the reactor for its run (`trio.socket.set_custom_hostname_resolver`)."""

    async def getaddrinfo(self, host: bytes | None, port: bytes | str | int | None, family: int = 0,
                          type: int = 0, proto: int = 0, flags: int = 0) -> Any:
        import socket

        return await to_thread(socket.getaddrinfo, host, port, family, type, proto, flags, abandon_on_cancel=True)

    async def getnameinfo(self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int) -> tuple[str, str]:
        import socket

        return await to_thread(socket.getnameinfo, sockaddr, flags, abandon_on_cancel=True)


__all__ = ["OFFLOAD", "Resolver", "ThreadCache", "to_thread"]
