"""How `async with Runner` waits for a blocking step (open, close) without blocking the host's event
loop, and without letting the host's cancellation cut it short: the step runs on a thread of its
own to its end, and the awaiting task waits for it shielded (asyncio or trio, found by sniffio)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable

import sniffio
import trio

from actor_run.protocols.failures import NotAsyncioOrTrio


async def run_shielded(fn: Callable[[], None], name: str) -> None:
    """Run `fn()` on a thread of its own and wait for its end without blocking the host's event loop
    (asyncio or trio), whatever cancels the awaiting task meanwhile (one cancellation or several);
    then raise what `fn` raised, else the cancellation that came meanwhile (asyncio), or leave it
    to the host's next checkpoint (trio: the cancelled scope stays cancelled)."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting task, raised there
            done.set_exception(exc)
        else:
            done.set_result(None)

    thread = threading.Thread(target=target, name=name, daemon=True)
    library = sniffio.current_async_library()
    if library == "trio":
        token, finished = trio.lowlevel.current_trio_token(), trio.Event()

        def wake_trio(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        done.add_done_callback(wake_trio)
        thread.start()
        with trio.CancelScope(shield=True):
            await finished.wait()
        thread.join()
        done.result()
    elif library == "asyncio":
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not waiter.done():
                waiter.set_result(None)

        done.add_done_callback(lambda _: loop.call_soon_threadsafe(settle))
        thread.start()
        cancelled: asyncio.CancelledError | None = None
        while not waiter.done():
            try:
                await asyncio.shield(waiter)
            except asyncio.CancelledError as exc:  # kept, and raised once fn has ended
                cancelled = exc
        thread.join()
        done.result()
        if cancelled is not None:
            raise cancelled
    else:
        raise NotAsyncioOrTrio(f"a Runner runs `async with` in asyncio or trio, not {library}")
