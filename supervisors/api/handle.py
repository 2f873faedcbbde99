"""What `Runner.submit` hands back: a `JobHandle` to wait on (from a thread, asyncio or trio) or
cancel one job by; the Runner's `statistics()` counters; and the `Waiters` of `Runner.wait`.
Imports only protocols, the actor pool's `blocking` and the batch supervisor's private cancel message."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from typing import TYPE_CHECKING

import msgspec
import sniffio
import trio

from actor_run.actors.pool import blocking
from actor_run.protocols.messages import JobEnded
from actor_run.protocols.specs import Job
from actor_run.supervisors.tree.batch import _CancelJob

if TYPE_CHECKING:
    from actor_run.supervisors.api.runner import Runner

_ENDS = threading.Lock()  # a handle's end against the making of its first waiter's future (brief)


class RunnerStatistics(msgspec.Struct, frozen=True):
    messages: int
    actor_turns: int
    pool_workers: int
    reactor_tasks: int
    reactor_timers: int
    ledger_writes: int


class JobHandle:
    """A submitted job (what `Runner.submit` returns).

    `result(timeout)` blocks until the job's `JobEnded` and returns it; `await wait_async()` does
    the same without blocking an asyncio or trio event loop; `done()` says whether it ended;
    `cancel()` asks the job to stop (its machine is deleted first; it then ends `canceled`). The
    `JobEnded` is in the ledger before any of these return it. Cancelling a task that awaits
    `wait_async()` stops the wait, not the job."""

    def __init__(self, runner: Runner, job: Job) -> None:
        self.job = job
        self.key = job.key
        self.reattached = False
        self.run = runner.run
        self._runner = runner
        self._ended: JobEnded | None = None
        # made for the first thread that waits: a Future is eleven objects the collector walks (its
        # Condition, RLock, their bound methods, lists), and a running job's handle needs none
        # until someone waits on it (issue 30's census: ten thousand running jobs)
        self._waiter: concurrent.futures.Future[JobEnded] | None = None

    @property
    def _future(self) -> concurrent.futures.Future[JobEnded]:
        """The future a waiter waits on, resolved with the job's end (made on first use)."""
        future = self._waiter
        if future is None:
            with _ENDS:
                future = self._waiter
                if future is None:
                    future = self._waiter = concurrent.futures.Future()
                ended = self._ended
            if ended is not None:
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # its _resolve set it
                    future.set_result(ended)
        return future

    def result(self, timeout: float | None = None) -> JobEnded:
        ended = self._ended
        return ended if ended is not None else self._future.result(timeout)

    def done(self) -> bool:
        return self._ended is not None

    async def wait_async(self) -> JobEnded:
        """Wait for the job's `JobEnded` inside an asyncio or trio event loop, without blocking it:
        the end wakes the loop through its own thread-safe entry (call_soon_threadsafe, a trio token)."""
        library = sniffio.current_async_library()
        if library == "trio":
            token, ended = trio.lowlevel.current_trio_token(), trio.Event()

            def wake_trio(_: object) -> None:
                with contextlib.suppress(trio.RunFinishedError):  # the loop ended while the job ran
                    token.run_sync_soon(ended.set)

            self._future.add_done_callback(wake_trio)
            await ended.wait()
        elif library == "asyncio":
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def settle() -> None:
                if not waiter.done():
                    waiter.set_result(None)

            def wake_asyncio(_: object) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed while the job ran
                    loop.call_soon_threadsafe(settle)

            self._future.add_done_callback(wake_asyncio)
            await waiter
        else:
            raise RuntimeError(f"wait_async runs in asyncio or trio, not {library}")
        return self._future.result(0)

    def _resolve(self, e: JobEnded) -> None:
        with _ENDS:
            if self._ended is not None:
                return  # the first end stands
            self._ended = e
            future = self._waiter
        if future is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # made meanwhile: set there too
                future.set_result(e)
        self._runner._one_ended(self)

    def cancel(self) -> None:
        self._runner._batch_tell(_CancelJob(key=self.key))


class _Waiter:
    """A thread in `Runner.wait`: the handles it waits for; `all_ended` once none is left."""

    __slots__ = ("all_ended", "left", "lock")

    def __init__(self, left: set[JobHandle]) -> None:
        self.left = left
        self.lock = threading.Lock()
        self.all_ended = threading.Event()

    def ended(self, handle: JobHandle) -> None:
        with self.lock:
            self.left.discard(handle)
            if not self.left:
                self.all_ended.set()


class Waiters:
    """The threads in `Runner.wait`, each woken once, when the last of its handles has ended (a
    result() per handle woke a waiting thread once per job that ended meanwhile: 8 % of the GIL's
    time in the end burst of a thousand jobs), with no Future per handle (eleven objects each for
    the collector to walk)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Waiter] = []

    def wait(self, handles: list[JobHandle], timeout: float | None) -> None:
        """Until every one of `handles` has ended, or `timeout` seconds."""
        waiter = _Waiter({h for h in handles if not h.done()})
        if not waiter.left:
            return
        with self._lock:
            self._waiting.append(waiter)
        try:
            for h in list(waiter.left):  # those that ended before the waiter was seen
                if h.done():
                    waiter.ended(h)
            with blocking():
                waiter.all_ended.wait(timeout)
        finally:
            with self._lock:
                self._waiting.remove(waiter)

    def ended(self, handle: JobHandle) -> None:
        """A handle has its end (on the ledger's writer thread)."""
        for waiter in tuple(self._waiting):
            waiter.ended(handle)
