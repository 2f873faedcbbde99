"""What `Runner.submit` hands back: a `JobHandle` to wait on (from a thread, asyncio or trio) or
cancel one job by; the `Board` of a Runner's handles (the small port a handle talks through: it
holds the handles, the threads waiting on them and the line to the batch supervisor, nothing of
the Runner); the Runner's `statistics()` counters; and the `Waiters` of `Runner.wait`.

Waits from a thread (`JobHandle.result`, `Board.wait`) wake at least every `SLICE_S` seconds, so
an exception raised into the waiting thread (KeyboardInterrupt on the main thread, Ray's or
Celery's cancel, `PyThreadState_SetAsyncExc`) gets through within that time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from typing import Any

import msgspec
import pykka
import sniffio
import trio
from loguru import logger

from actor_run.actors.pool import blocking
from actor_run.protocols.failures import RunnerClosed, WaitTimeout
from actor_run.protocols.messages import JobEnded, Message
from actor_run.protocols.specs import Job
from actor_run.supervisors.tree.batch import CancelJob

SLICE_S = 0.2  # a thread waiting on a job wakes this often, so that an interrupt reaches it

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

    def __init__(self, board: Board, job: Job, run: str) -> None:
        self.job = job
        self.key = job.key
        self.reattached = False
        self.run = run
        self._board = board
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
        """Block this thread until the job ended (its `JobEnded`, in the ledger already), or raise
        `WaitTimeout` after `timeout` seconds. Wakes every SLICE_S: an interrupt gets through."""
        ended = self._ended
        if ended is not None:
            return ended
        future = self._future
        deadline = None if timeout is None else time.monotonic() + timeout
        with blocking():
            while True:
                left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
                try:
                    return future.result(max(0.0, left))
                except concurrent.futures.TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise WaitTimeout(f"{self.key} still running after {timeout} s") from None

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
            raise TypeError(f"wait_async runs in asyncio or trio, not {library}")
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
        self._board.ended(self)

    def cancel(self) -> None:
        """Ask the job to stop: its machine is deleted first, then it ends `canceled`."""
        self._board.tell(CancelJob(key=self.key))


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
            deadline = None if timeout is None else time.monotonic() + timeout
            with blocking():
                while not waiter.all_ended.is_set():
                    left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
                    if left <= 0:
                        break
                    waiter.all_ended.wait(left)  # in slices: an interrupt reaches this thread
        finally:
            with self._lock:
                self._waiting.remove(waiter)

    def ended(self, handle: JobHandle) -> None:
        """A handle has its end (on the ledger's writer thread)."""
        for waiter in tuple(self._waiting):
            waiter.ended(handle)


class Board:
    """A Runner's submitted jobs: their handles by key, the threads waiting on them, and the one line
    to the batch supervisor (`tell`). A JobHandle talks to the Runner through this and nothing else.
    Every method may be called from any thread."""

    def __init__(self) -> None:
        self.handles: dict[str, JobHandle] = {}
        self.waiters = Waiters()
        self._batch: pykka.ActorRef[Any] | None = None

    def connect(self, batch: pykka.ActorRef[Any] | None) -> None:
        """The batch supervisor messages go to (None: the Runner is closed)."""
        self._batch = batch

    def tell(self, message: Message) -> None:
        """Tell the batch supervisor `message`. Raises RunnerClosed when the Runner is not open; a
        batch supervisor that failed (it ended every job then) drops the message."""
        batch = self._batch
        if batch is None:
            raise RunnerClosed("the Runner is not open (use `with Runner(...)` or `async with`)")
        try:
            batch.tell(message)
        except pykka.ActorDeadError:
            logger.debug("the batch supervisor is gone; dropped {}", type(message).__name__)

    def add(self, job: Job, run: str) -> JobHandle:
        handle = JobHandle(self, job, run)
        self.handles[job.key] = handle
        return handle

    def running(self, key: str) -> JobHandle | None:
        """The handle of `key` if it has not ended."""
        handle = self.handles.get(key)
        return handle if handle is not None and not handle.done() else None

    def unfinished(self) -> bool:
        return any(not h.done() for h in self.handles.values())

    def ended(self, handle: JobHandle) -> None:
        """A handle has its end (on the ledger's writer thread): wake whoever waits for it."""
        self.waiters.ended(handle)

    def wait(self, timeout: float | None = None) -> list[JobEnded]:
        """Block until every job on the board has ended; raise WaitTimeout after `timeout` seconds."""
        handles = list(self.handles.values())
        self.waiters.wait(handles, timeout)
        unfinished = sum(1 for h in handles if not h.done())
        if unfinished:
            raise WaitTimeout(f"{unfinished} of {len(handles)} jobs still running")
        return [h.result(0) for h in handles]

