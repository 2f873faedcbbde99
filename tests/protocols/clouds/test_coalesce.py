"""Coalescer: concurrent calls share thread hops, each caller gets its own answer, and a cancelled
caller's item still runs to the end before the cancel is raised (or, still waiting its delay, is
taken back)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import trio
import trio.testing

from actor_run.protocols.clouds.coalesce import Coalescer


class Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.done: list[int] = []
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def run_many(self, items: list[int]) -> list[int | BaseException]:
        time.sleep(self.delay_s)  # the fake call's deliberate slowness: calls pile up behind it
        with self.lock:
            self.batches.append(list(items))
            self.done += items
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


def test_concurrent_calls_share_thread_hops_and_get_their_own_answers() -> None:
    rec = Recorder(delay_s=0.05)
    answers: dict[int, int | str] = {}

    async def main() -> None:
        batch = Coalescer(rec.run_many)

        async def call(i: int) -> None:
            try:
                answers[i] = await batch(i)
            except ValueError as exc:
                answers[i] = str(exc)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(call, i)

    trio.run(main)
    assert answers == {i: (f"odd {i}" if i % 2 else i * 10) for i in range(100)}
    assert sorted(rec.done) == list(range(100))
    assert len(rec.batches) <= 3  # the first call's batch, then what queued meanwhile


def test_a_cancelled_caller_waits_for_its_item_then_is_cancelled() -> None:
    rec = Recorder(delay_s=0.3)
    seen: list[str] = []

    async def main() -> None:
        batch = Coalescer(rec.run_many)
        with trio.move_on_after(0.05) as scope:
            await batch(4)
            seen.append("returned")
        assert scope.cancelled_caught
        seen.append("cancelled")
        assert rec.done == [4]  # the change happened before the cancel came through

    trio.run(main)
    assert seen == ["cancelled"]


def test_the_batch_failing_as_a_whole_reaches_every_caller() -> None:
    def broken(items: list[int]) -> list[int]:
        raise OSError("disk gone")

    async def main() -> None:
        batch: Coalescer[int, int] = Coalescer(broken)
        with pytest.raises(OSError, match="disk gone"):
            await batch(1)
        with pytest.raises(OSError, match="disk gone"):  # and the next call runs again
            await batch(2)

    trio.run(main)



def test_items_wait_their_delay_on_one_timer_and_go_together() -> None:
    """`delay_s` (the sim's delete latency): each item goes into a batch that long after it was asked
    for, never sooner, and items asked for together go together (a timer per batch, not a sleep per
    caller). On trio's virtual clock: the hundred are asked at one instant however slowly a loaded
    machine starts their tasks, and time moves only when the test says."""
    rec = Recorder()
    waited: list[float] = []
    clock = trio.testing.MockClock()

    async def main() -> None:
        batch = Coalescer(rec.run_many, delay_s=0.2)

        async def call(i: int) -> None:
            asked = trio.current_time()
            with contextlib.suppress(ValueError):
                await batch(i)
            waited.append(trio.current_time() - asked)

        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(call, i)
            await trio.testing.wait_all_tasks_blocked()
            clock.jump(0.19)
            await trio.testing.wait_all_tasks_blocked()
            assert rec.batches == []  # not before the delay
            clock.jump(0.01)

    trio.run(main, clock=clock)
    assert sorted(rec.done) == list(range(100))
    assert len(rec.batches) == 1  # one timer found them all due
    assert min(waited) >= 0.2


def test_a_caller_cancelled_while_its_item_waits_takes_it_back() -> None:
    """Cancelled before its delay ran out, the item never goes (the provider was never asked); the
    other items go as planned."""
    rec = Recorder()

    async def main() -> None:
        batch = Coalescer(rec.run_many, delay_s=0.3)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch, 2)
            with trio.move_on_after(0.05) as scope:
                await batch(4)
            assert scope.cancelled_caught
        assert rec.done == [2]

    trio.run(main)
