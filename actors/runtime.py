"""The reactor: one trio thread that does all the waiting (network, subprocesses, timers) for every
actor, and beside it a plain asyncio loop on a thread of its own for asyncssh (protocols/hosts/aio.py:
its tasks find that loop as the current one).

Actors never block on the network. They `spawn` a coroutine on the reactor with a callback that
`tell`s them the result as a message, and keep the returned `Task` to cancel it. `call` (block the
calling thread until a coroutine finishes) is for the few places that must wait: the lease's stop
hook, the CLI, tests. A call that is cancelled or runs out of time raises `CallCancelled`; it
never returns None.

Threads: `start()` starts the asyncio loop's thread, then the reactor thread, and returns once both
loops run; `stop()` cancels every task still running, joins the reactor thread, then stops and
joins the asyncio loop's (the tasks' shielded cleanups, closing SSH channels, still have it).
A reactor holds the actor pool (actors/pool.py) and the offload threads (protocols/offload.py)
while it runs: when the last one stops, their idle threads end and are joined, so a closed
Runner leaves no thread of ours.
Callbacks given to `spawn`/`call_later` run ON THE REACTOR THREAD: they must only hand the result
on (`ActorRef.tell` is thread-safe and never blocks), never wait.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import heapq
import itertools
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import outcome
import trio

from actor_run.actors.flag import Flag
from actor_run.actors.pool import POOL, blocking, defer
from actor_run.protocols.failures import CallCancelled, ReactorError
from actor_run.protocols.hosts.aio import AsyncioLoop, set_current_asyncio_loop
from actor_run.protocols.offload import OFFLOAD, Resolver

T = TypeVar("T")
# what a reactor task ended with, as outcome.acapture makes it (a union, so isinstance narrows both ways)
Result = outcome.Value[T] | outcome.Error


class ReactorStatistics(msgspec.Struct, frozen=True):
    tasks_started: int
    tasks_running: int
    timers_started: int


class Task(Flag):
    """A coroutine running on the reactor; `cancel()` is safe from any thread, at any time. Set (a
    Flag: `wait_finished` blocks a non-reactor thread until then) once it has ended."""

    __slots__ = ("_cancelled", "_reactor", "_scope", "name")

    def __init__(self, reactor: Reactor, name: str) -> None:
        super().__init__()
        self._reactor = reactor
        self._scope: trio.CancelScope | None = None
        self._cancelled = False
        self.name = name

    @property
    def done(self) -> bool:
        return self.is_set()

    wait_finished = Flag.wait
    _set_done = Flag.set

    def cancel(self) -> None:
        self._cancelled = True
        if not self.done:
            self._reactor.soon(self._cancel_here)

    def _cancel_here(self) -> None:
        if self._scope is not None:
            self._scope.cancel()


class _Timer(Task):
    """A `call_later`: an entry in the reactor's one heap of timers, not a trio task. A thousand
    meters' budget guards were a thousand sleeping tasks, each about 25 objects the collector walks
    (a task, its context, cancel scope and status, the coroutines of a sleep); an entry is one."""

    __slots__ = ("callback", "due", "seq")

    def __init__(self, reactor: Reactor, name: str, callback: Callable[[], None], seq: int) -> None:
        super().__init__(reactor, name)
        self.callback: Callable[[], None] | None = callback
        self.due = 0.0
        self.seq = seq

    def __lt__(self, other: _Timer) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)

    def _cancel_here(self) -> None:  # on the reactor thread
        if not self.done:
            self.callback = None
            self._set_done()
            self._reactor._timer_cancelled()


class Reactor:
    def __init__(self, name: str = "actor-run-reactor") -> None:
        self._name = name
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: trio.Event | None = None
        self._aio: AsyncioLoop | None = None
        self._held = False  # holds POOL and OFFLOAD from start to stop
        self._context: contextvars.Context | None = None
        self._ids = itertools.count()
        self._started = 0
        self._running = 0
        self._timers = 0
        self._error: BaseException | None = None
        self._pending: collections.deque[Callable[[], Any]] = collections.deque()
        self._draining = False
        self._heap: list[_Timer] = []  # pending timers (and cancelled ones not yet dropped)
        self._heap_dead = 0  # cancelled timers still in the heap
        self._heap_scope: trio.CancelScope | None = None  # the timers' task's wait, until the first is due

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Reactor:
        """Start both threads (any thread but the reactor's); raises `ReactorError` if they did not start."""
        if self._thread is not None:
            raise ReactorError(f"{self._name} was started already")
        POOL.hold()
        OFFLOAD.hold()
        self._held = True
        self._aio = AsyncioLoop(f"{self._name}-asyncio").start()
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self.stop()
            raise ReactorError("the reactor did not start") from self._error
        return self

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:  # recorded for start()/stop(); the thread ends here
            self._error = exc
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stopping = trio.Event()
        # tasks are started from run_sync_soon callbacks, which run outside this context: start
        # them inside a copy of it, where the asyncio loop is the current one (SSH hosts find it)
        set_current_asyncio_loop(self._aio)
        trio.socket.set_custom_hostname_resolver(Resolver())  # name lookups on our threads (offload.py)
        self._context = contextvars.copy_context()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._run_timers, name="actor-run timers")
            self._ready.set()
            await self._stopping.wait()
            nursery.cancel_scope.cancel()
        self._nursery = None

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every task, join the reactor thread, then stop and join the asyncio loop's (any
        thread but the reactor's). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            if self.in_reactor:
                raise ReactorError("Reactor.stop from the reactor thread would wait for itself")
            assert self._stopping is not None
            with contextlib.suppress(CallCancelled):  # it ended between the check and the call
                self.soon(self._stopping.set)
            self._thread.join(timeout)
        if self._aio is not None:
            self._aio.stop(timeout)
        if self._held:  # the last reactor to stop ends the pool's and the offload's idle threads
            self._held = False
            OFFLOAD.release(timeout)
            POOL.release(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._nursery is not None

    @property
    def in_reactor(self) -> bool:
        return threading.current_thread() is self._thread

    @property
    def asyncio_loop(self) -> AsyncioLoop | None:
        """The asyncio loop beside the reactor (None before `start`): `await it.run(fn, *args)`
        from a reactor task runs an asyncio coroutine there."""
        return self._aio

    def statistics(self) -> ReactorStatistics:
        return ReactorStatistics(self._started, self._running, self._timers)

    # --- running things -------------------------------------------------------------------------

    def soon(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the reactor thread soon. Callbacks queue in a deque; only the first of a
        burst pays for trio's entry queue (a lock and a wakeup write), the rest ride along."""
        if self._token is None:
            raise CallCancelled("the reactor is not running")
        self._pending.append(fn)
        if not self._draining:
            self._draining = True
            # from an actor's turn the wake-up waits for the end of the worker's run of turns
            # (actors/pool.py `defer`): a burst of spawns wakes the reactor once, not once each
            if self._nursery is None or not defer(self._wake_deferred):
                self._wake()

    def _wake(self) -> None:
        assert self._token is not None
        try:
            self._token.run_sync_soon(self._drain)
        except trio.RunFinishedError as exc:
            self._draining = False  # no drain was scheduled: the next call must raise too, not wait
            raise CallCancelled("the reactor has stopped") from exc

    def _wake_deferred(self) -> None:
        """A pool worker's put-off wake-up. If the run ended meanwhile, what was queued runs here, as
        it would have on a stopping reactor (a spawn's task ends `CallCancelled`)."""
        try:
            self._wake()
        except CallCancelled:
            pending = self._pending
            while pending:
                with contextlib.suppress(Exception):
                    pending.popleft()()

    def _drain(self) -> None:
        # clear the flag first: a callback appended after the last popleft() schedules a new drain
        self._draining = False
        pending = self._pending
        while pending:
            pending.popleft()()

    def spawn(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        on_done: Callable[[Result[T]], None] | None = None,
        name: str = "",
    ) -> Task:
        """Run `fn(*args)` on the reactor; `on_done(outcome)` runs on the reactor thread when it ends.
        A cancelled task ends with `outcome.Error(CallCancelled)`."""
        task = Task(self, name or getattr(fn, "__name__", "task"))
        self._started += 1

        def begin() -> None:
            if self._nursery is None:
                self._finish(task, on_done, outcome.Error(CallCancelled("the reactor is stopping")))
                return
            assert self._context is not None
            run: Callable[..., object] = self._context.run  # start_soon's argument types are beyond mypy here
            run(self._nursery.start_soon, self._wrap, task, fn, args, on_done, name=task.name)

        self.soon(begin)
        return task

    async def _wrap(
        self, task: Task, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
        on_done: Callable[[Result[T]], None] | None,
    ) -> None:
        self._running += 1
        result: Result[T]
        try:
            with trio.CancelScope() as scope:
                task._scope = scope
                if task._cancelled:
                    scope.cancel()
                # outcome.acapture's work, without its coroutine (one less object per running task)
                try:
                    result = outcome.Value(await fn(*args))
                except BaseException as exc:  # handed to on_done, as acapture would
                    result = outcome.Error(exc)
            cancelled = isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled)
            if scope.cancelled_caught or cancelled:
                result = outcome.Error(CallCancelled(f"{task.name} was cancelled"))
        finally:
            self._running -= 1
        self._finish(task, on_done, result)

    @staticmethod
    def _finish(task: Task, on_done: Callable[[Result[T]], None] | None, result: Result[T]) -> None:
        task._set_done()
        if on_done is not None:
            on_done(result)

    def call_later(self, delay: float, callback: Callable[[], None], name: str = "timer") -> Task:
        """Run `callback()` on the reactor thread after `delay` seconds, unless cancelled first. The
        returned Task is done once the callback ran or the timer was cancelled (or the reactor
        stopped first). Every timer waits in one heap, on one reactor task: a pending timer is no
        task of its own."""
        self._timers += 1
        timer = _Timer(self, name, callback, self._timers)

        def begin() -> None:
            if self._nursery is None or timer._cancelled:
                timer.callback = None
                timer._set_done()
                return
            timer.due = trio.current_time() + max(0.0, delay)
            heapq.heappush(self._heap, timer)
            scope = self._heap_scope
            if scope is not None and timer.due < scope.deadline:
                scope.deadline = timer.due

        self.soon(begin)
        return timer

    async def _run_timers(self) -> None:
        """The one task every timer waits on: asleep until the earliest is due, then runs each due."""
        heap = self._heap
        try:
            while True:
                with trio.CancelScope(deadline=heap[0].due if heap else math.inf) as scope:
                    self._heap_scope = scope
                    await trio.sleep_forever()
                self._heap_scope = None
                now = trio.current_time()
                while heap and heap[0].due <= now:
                    timer = heapq.heappop(heap)
                    callback, timer.callback = timer.callback, None
                    if timer.done:  # cancelled
                        self._heap_dead -= 1
                        continue
                    timer._set_done()
                    if timer._cancelled:  # cancelled from another thread; its _cancel_here finds it done
                        continue
                    assert callback is not None
                    callback()
        finally:  # the reactor stops: what never fired is done, its callback not called
            self._heap_scope = None
            for timer in heap:
                timer.callback = None
                timer._set_done()
            heap.clear()
            self._heap_dead = 0

    def _timer_cancelled(self) -> None:
        """A timer in the heap was cancelled: drop the cancelled once they are half of it (a
        week-long budget guard cancelled at its job's end must not wait in memory for a week)."""
        self._heap_dead += 1
        if self._heap_dead > 64 and self._heap_dead * 2 > len(self._heap):
            self._heap[:] = [t for t in self._heap if not t.done]
            heapq.heapify(self._heap)
            self._heap_dead = 0

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Block this (non-reactor) thread until `fn(*args)` finishes on the reactor; its result or
        its exception. Raises `CallCancelled` after `timeout` seconds (the task is cancelled)."""
        if self.in_reactor:
            raise ReactorError("Reactor.call from the reactor thread would deadlock")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def done(result: Result[T]) -> None:
            if isinstance(result, outcome.Value):
                future.set_result(result.value)
            else:
                future.set_exception(result.error)

        task = self.spawn(fn, *args, on_done=done)
        try:
            with blocking():
                return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            task.cancel()
            raise CallCancelled(f"{task.name} did not finish within {timeout} s") from exc
