"""A plain asyncio event loop on a thread of its own, and the bridge that runs asyncio coroutines on
it from trio: asyncssh (hosts/ssh.py) lives there.

Why a loop of our own and not trio-asyncio: importing trio-asyncio patches asyncio for the whole
process (its event loop policy and loop class), so an embedding host's own `asyncio.run` ran about
6x slower and Prefect 3 processes crashed at exit. This loop is an ordinary `SelectorEventLoop`
that nothing else sees: no policy is set, no signal handler installed, no thread's current loop
changed (the host's policy, even uvloop's, is neither used nor touched).

Threads: `start()` starts the loop's thread and returns once the loop runs; `stop()` cancels what
still runs on it, shuts down its default executor (asyncio's getaddrinfo threads), closes it and
joins the thread. `run(fn, *args)` is awaited from a trio task: `fn(*args)` is called ON THE LOOP'S
THREAD and its coroutine runs there as an asyncio task; its end wakes the trio task through the
trio run's token. A trio cancellation cancels the asyncio task and waits until it has ended (an
asyncio side never goes on behind a trio caller that has returned; if it finished anyway, its value
is returned and the cancellation arrives at the caller's next checkpoint); an asyncio task
cancelled from the loop's side (the loop stopping) raises `CallCancelled`, never returns None.

`open_asyncio_loop()` starts one for the body of an `async with` and makes it the current one
(`current_asyncio_loop()`) for the tasks started inside: the reactor does the same for all its
tasks (actors/runtime.py), tests and benches use it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio

from actor_run.protocols.failures import CallCancelled, ReactorError

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[AsyncioLoop | None] = contextvars.ContextVar("actor_run_asyncio_loop", default=None)
_CANCELLED = object()  # what the loop's side hands back when a trio cancellation cancelled its task


class AsyncioLoop:
    """An asyncio event loop running on a daemon thread named `name`, for coroutines run from trio."""

    def __init__(self, name: str = "actor-run-asyncio") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> AsyncioLoop:
        """Start the loop's thread; returns once the loop runs (any thread; blocks for that moment)."""
        if self._thread is not None:
            raise ReactorError(f"{self.name} was started already")
        loop = asyncio.SelectorEventLoop()  # not the policy's: a host's policy is its own business
        self._loop = loop
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def _main(self) -> None:
        loop = self._loop
        assert loop is not None
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:  # what still runs is cancelled and waited for; asyncio's own threads are joined
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                self._ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop and join its thread (not from the loop's own thread). Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        if threading.current_thread() is thread:
            raise ReactorError(f"{self.name} cannot be stopped from its own thread")
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    @property
    def running(self) -> bool:
        loop = self._loop
        return loop is not None and not loop.is_closed() and self._thread is not None and self._thread.is_alive()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop itself (None before `start`): touch its objects only from its thread."""
        return self._loop

    def soon(self, fn: Callable[[], Any]) -> None:
        """Call `fn()` on the loop's thread soon (any thread). Raises `CallCancelled` once the loop
        has stopped. For asyncssh calls that are not coroutines (`abort`, `close`): its objects are
        not thread-safe."""
        loop = self._loop
        if loop is None:
            raise CallCancelled(f"{self.name} was never started")
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError as exc:  # "Event loop is closed"
            raise CallCancelled(f"{self.name} has stopped") from exc

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """`await fn(*args, **kwargs)` on the loop, from a trio task; its value or its exception.
        Raises `CallCancelled` when the loop has stopped or cancelled the task itself; a trio
        cancellation of the caller cancels the asyncio task (see the module's docstring)."""
        loop = self._loop
        token = trio.lowlevel.current_trio_token()
        caller = trio.lowlevel.current_task()
        aio_task: asyncio.Future[T] | None = None
        cancel_requested = False
        raise_cancel: Callable[[], Any] | None = None
        name = getattr(fn, "__qualname__", "a coroutine")

        def wake(result: outcome.Outcome[Any]) -> None:  # on the loop's thread
            with contextlib.suppress(trio.RunFinishedError):  # the trio run is gone: nobody waits
                token.run_sync_soon(trio.lowlevel.reschedule, caller, result)

        def done(task: asyncio.Future[T]) -> None:  # on the loop's thread
            if task.cancelled():
                wake(outcome.Value(_CANCELLED) if cancel_requested
                     else outcome.Error(CallCancelled(f"{name} was cancelled on {self.name} (it is stopping)")))
                return
            exc = task.exception()
            wake(outcome.Error(exc) if exc is not None else outcome.Value(task.result()))

        def begin() -> None:  # on the loop's thread, before any `cancel_it` (the loop's queue is FIFO)
            nonlocal aio_task
            try:
                aio_task = asyncio.ensure_future(fn(*args, **kwargs), loop=loop)
            except BaseException as exc:  # fn itself raised: the caller hears it
                wake(outcome.Error(exc))
                return
            aio_task.add_done_callback(done)

        def cancel_it() -> None:  # on the loop's thread
            if aio_task is not None:
                aio_task.cancel()

        def abort(raiser: Callable[[], Any]) -> trio.lowlevel.Abort:  # on the trio thread
            nonlocal cancel_requested, raise_cancel
            cancel_requested, raise_cancel = True, raiser
            with contextlib.suppress(CallCancelled):  # stopped: its own shutdown cancels the task
                self.soon(cancel_it)
            return trio.lowlevel.Abort.FAILED  # the task ends first: `done` wakes us

        if loop is None:
            raise CallCancelled(f"{self.name} was never started")
        self.soon(begin)
        value = await trio.lowlevel.wait_task_rescheduled(abort)
        if value is _CANCELLED:
            assert raise_cancel is not None
            raise_cancel()  # trio's Cancelled, for the scope that asked
        result: T = value
        return result


def current_asyncio_loop() -> AsyncioLoop:
    """The loop the current trio task was started under (`open_asyncio_loop`, the reactor's).
    Raises `ReactorError` outside any."""
    loop = _CURRENT.get()
    if loop is None:
        raise ReactorError("no asyncio loop here: run inside the reactor or `open_asyncio_loop()`")
    return loop


def set_current_asyncio_loop(loop: AsyncioLoop | None) -> contextvars.Token[AsyncioLoop | None]:
    """Make `loop` the current one in this context (the reactor's task context)."""
    return _CURRENT.set(loop)


@contextlib.asynccontextmanager
async def open_asyncio_loop(name: str = "actor-run-asyncio") -> AsyncIterator[AsyncioLoop]:
    """A started `AsyncioLoop`, current for the body (and the tasks started in it); stopped and
    joined on the way out (blocking this trio thread while its thread ends)."""
    loop = AsyncioLoop(name).start()
    reset = _CURRENT.set(loop)
    try:
        yield loop
    finally:
        _CURRENT.reset(reset)
        loop.stop()
