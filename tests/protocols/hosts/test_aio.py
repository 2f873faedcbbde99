"""The asyncio loop beside the reactor (protocols/hosts/aio.py): results, exceptions and cancellation
across the bridge, both ways, and its thread's end."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from actor_run.protocols.failures import CallCancelled, ReactorError
from actor_run.protocols.hosts.aio import AsyncioLoop, current_asyncio_loop, open_asyncio_loop


def test_a_value_and_an_exception_come_back_from_the_loop_thread() -> None:
    async def on_loop(x: int) -> tuple[int, str]:
        await asyncio.sleep(0)
        return x + 1, threading.current_thread().name

    async def fails() -> None:
        await asyncio.sleep(0)
        raise OSError("reset by peer")

    async def main() -> None:
        async with open_asyncio_loop("aio-under-test") as loop:
            assert current_asyncio_loop() is loop
            assert await loop.run(on_loop, 41) == (42, "aio-under-test")
            with pytest.raises(OSError, match="reset by peer"):
                await loop.run(fails)

    trio.run(main)


def test_a_trio_cancellation_cancels_the_asyncio_task_and_waits_for_its_end() -> None:
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # its own cleanup: the trio caller waits for it
            ended.append("cancelled")
            raise

    async def main() -> None:
        async with open_asyncio_loop() as loop:
            with trio.move_on_after(0.2) as scope:
                await loop.run(slow)
            assert scope.cancelled_caught
            assert ended == ["cancelled"]

    trio.run(main)


def test_a_task_cancelled_on_the_asyncio_side_raises_call_cancelled_never_none() -> None:
    async def cancels_itself() -> int:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)
        return 1

    async def main() -> None:
        async with open_asyncio_loop() as loop:
            with pytest.raises(CallCancelled, match="cancelled on"):
                await loop.run(cancels_itself)

    trio.run(main)


def test_stopping_the_loop_under_a_waiting_call_raises_call_cancelled() -> None:
    loop = AsyncioLoop("aio-stopped-under-a-call").start()
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, lambda: (started.wait(10), loop.stop()))
            with pytest.raises(CallCancelled):
                await loop.run(forever)
        with pytest.raises(CallCancelled, match="stopped"):
            await loop.run(asyncio.sleep, 0)

    try:
        trio.run(main)
    finally:
        loop.stop()
    assert not any(t.name == "aio-stopped-under-a-call" for t in threading.enumerate())


def test_outside_any_loop_the_error_names_what_is_missing() -> None:
    async def main() -> None:
        with pytest.raises(ReactorError, match="no asyncio loop"):
            current_asyncio_loop()

    trio.run(main)

