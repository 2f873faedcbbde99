"""Shared clocks: every loop of one period wakes on the same beat, and a clock nobody waits on stops.

On trio's virtual clock (MockClock, jumping as soon as every task waits): the beats are exact and a
busy machine cannot stretch a sleep past a beat.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable

import pytest
import trio
import trio.testing

from actor_run.actors.ticks import _CLOCKS, Subscription, Ticker, call_at, cancel_alarm, subscribe, tick


def test_loops_of_one_period_wake_together_and_the_clock_stops_when_unused() -> None:
    trio.run(_loops_share_a_clock, clock=trio.testing.MockClock(autojump_threshold=0))


async def _loops_share_a_clock() -> None:
    woke: list[list[float]] = []

    async def loop() -> None:
        times = []
        for _ in range(3):
            await tick(0.05)
            times.append(trio.current_time())
        woke.append(times)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(50):  # started over about 30 ms: sleeps of their own would wake as spread
                nursery.start_soon(loop)
                await trio.sleep(0.0006)
            assert list(_CLOCKS.get()) == [0.05]  # one clock for the fifty loops
        assert len(woke) == 50
        # every wake-up falls on a beat: tight clusters a period apart (a sleep of their own each
        # would spread the loops' wake-ups over the 30 ms their starts took)
        clusters: list[list[float]] = []
        for t in sorted(t for times in woke for t in times):
            if clusters and t - clusters[-1][-1] < 0.01:
                clusters[-1].append(t)
            else:
                clusters.append([t])
        assert len(clusters) <= 4  # three beats, and a fourth if the starts straddled the first
        assert all(c[-1] - c[0] < 0.01 for c in clusters)
        assert woke[0][1] - woke[0][0] >= 0.05 - 1e-6
        await trio.sleep(0.2)  # a beat that finds nobody waiting stops the clock
        assert _CLOCKS.get() == {}
        await tick(0.02)  # and a later wait starts a new one
        assert list(_CLOCKS.get()) == [0.02]


def test_a_cancelled_wait_leaves_the_clock() -> None:
    trio.run(_cancelled_wait, clock=trio.testing.MockClock(autojump_threshold=0))


async def _cancelled_wait() -> None:
    with trio.fail_after(5):
        with trio.move_on_after(0.01):
            await tick(10.0)
        clock = _CLOCKS.get()[10.0]
        assert len(clock.parked) == 0


def test_subscribers_beat_on_the_clock_until_cancelled_or_they_decline() -> None:
    trio.run(_subscribers, clock=trio.testing.MockClock(autojump_threshold=0))


async def _subscribers() -> None:
    beats: dict[str, list[float]] = {"kept": [], "cancelled": [], "declines": []}

    def beat(name: str, keep: bool = True) -> Subscription:
        def fn() -> bool:
            beats[name].append(trio.current_time())
            return keep

        return Subscription(fn)

    kept, cancelled, declines = beat("kept"), beat("cancelled"), beat("declines", keep=False)
    with trio.fail_after(5):
        for sub in (kept, cancelled, declines):
            subscribe(0.05, sub)
        assert len(_CLOCKS.get()[0.05].subs) == 3  # one clock, no task per subscriber
        await trio.sleep(0.075)  # the first beat: within a period
        cancelled.cancel()
        await trio.sleep(0.15)
        assert len(beats["kept"]) >= 3
        assert len(beats["cancelled"]) == 1
        assert len(beats["declines"]) == 1  # it said False at its first beat: dropped
        gaps = [b - a for a, b in zip(beats["kept"], beats["kept"][1:], strict=False)]
        assert all(g >= 0.05 - 1e-6 for g in gaps)
        kept.cancel()
        await trio.sleep(0.15)  # no subscriber, nobody parked: the clock stops
        assert _CLOCKS.get() == {}
        subscribe(0.05, cancelled)  # cancelled before it was subscribed: never added, no clock started
        assert _CLOCKS.get() == {}


def test_a_ticker_waits_on_the_shared_beat_and_a_cancel_leaves_the_clock() -> None:
    trio.run(_ticker_beats, clock=trio.testing.MockClock(autojump_threshold=0))


async def _ticker_beats() -> None:
    woke: list[float] = []

    async def loop() -> None:
        ticker = Ticker(0.05)
        for _ in range(3):
            await ticker.wait()
            woke.append(trio.current_time())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop)
            await tick(0.05)  # a tick() and a Ticker of one period share the clock
            assert list(_CLOCKS.get()) == [0.05]
        assert len(woke) == 3
        assert [b - a for a, b in itertools.pairwise(woke)] == pytest.approx([0.05, 0.05])  # one wake-up per beat
        with trio.move_on_after(0.01):
            await Ticker(10.0).wait()
        assert len(_CLOCKS.get()[10.0].parked) == 0


def test_a_ticker_wait_makes_fewer_tracked_objects_than_a_tick() -> None:
    """What a wait makes lives until the beat, and at 10,000 watched jobs the collector's young passes
    walked it all (bench/RESULTS.md item 49): a Ticker's wait is trio's trap alone."""
    trio.run(_objects_per_wait)


async def _objects_per_wait() -> None:
    n = 500

    async def parked(wait_in: str, ready: trio.Event) -> None:
        ticker = Ticker(1000.0)
        if len(ready_count) == n - 1:
            ready.set()
        ready_count.append(1)
        if wait_in == "tick":
            await tick(1000.0)
        else:
            await ticker.wait()

    counts = {}
    for wait_in in ("tick", "ticker"):
        ready_count: list[int] = []
        ready = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(parked, wait_in, ready)
            await ready.wait()
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            counts[wait_in] = len(gc.get_objects())
            nursery.cancel_scope.cancel()
    # a tick's wait: its coroutine, a ParkingLot's, the lot's abort closure, its cell and tuple... about
    # five more than a Ticker's
    assert counts["tick"] - counts["ticker"] >= 4 * n


def test_waits_until_a_moment_share_one_timer_and_each_wakes_at_its_moment() -> None:
    """`Ticker.wait_until` (a virtual job's known end, item 60): 200 loops each waiting for a moment of
    its own wake at that moment, never sooner, on one heap served by one task: one deadline in trio's
    heap while they wait, not a sleep (a cancel scope and its deadline) each; a cancelled wait wakes
    nobody later; a ticker goes back to the shared beat after."""
    trio.run(_alarms, clock=trio.testing.MockClock(autojump_threshold=0))


async def _alarms() -> None:
    woke: dict[int, float] = {}
    deadlines: list[int] = []

    async def loop(i: int, at: float) -> None:
        ticker = Ticker(0.5)
        await ticker.wait_until(at)
        woke[i] = trio.current_time()
        await ticker.wait()  # and the shared beat after
        woke[-1 - i] = trio.current_time()

    start = trio.current_time()
    ats = {i: start + 1.0 + (i % 50) * 0.01 for i in range(200)}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i, at in ats.items():
                nursery.start_soon(loop, i, at)
            await trio.testing.wait_all_tasks_blocked()
            deadlines.append(sum(1 for o in gc.get_objects()
                                 if isinstance(o, trio.CancelScope) and o.deadline < math.inf))
            with trio.move_on_after(0.5):  # a wait cancelled before its moment
                await Ticker(0.5).wait_until(start + 1.2)
    assert deadlines == [2]  # this test's fail_after and the alarms' one sleep (a sleep_until each: 201)
    assert all(woke[i] == pytest.approx(at) for i, at in ats.items())
    assert all(woke[-1 - i] > woke[i] for i in ats)
    assert len(woke) == 400


def test_the_beats_keep_a_grid_however_long_a_beat_s_pass() -> None:
    """A subscriber's beat that takes a while (the pass that polls ten thousand virtual jobs, item 66)
    does not push the next beat back: beats fall `period` apart, not `period` after the pass's end;
    a pass longer than a period skips the beats it missed instead of running them back to back."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(_grid, clock, clock=clock)


async def _grid(clock: trio.testing.MockClock) -> None:
    beats: list[float] = []
    slow: list[float] = []

    def busy() -> bool:
        beats.append(trio.current_time())
        clock.jump(0.02)  # the pass's own time
        return len(beats) < 5

    def slower() -> bool:
        slow.append(trio.current_time())
        clock.jump(0.12)  # more than a period
        return len(slow) < 3

    with trio.fail_after(5):
        subscribe(0.05, Subscription(busy))
        await trio.sleep(1.0)
        assert [b - a for a, b in itertools.pairwise(beats)] == pytest.approx([0.05] * 4)
        subscribe(0.07, Subscription(slower))
        await trio.sleep(1.0)
        gaps = [b - a for a, b in itertools.pairwise(slow)]
        assert gaps == pytest.approx([0.12 + 0.07] * 2)  # the missed beats skipped: one period after the pass


def test_alarms_call_back_at_their_moments_and_a_cancelled_or_failing_one_hurts_no_other() -> None:
    """`call_at` (a subscriber's wait for a moment of its own: a virtual job's known end) calls its
    callback on the run's one heap of alarms at that moment, never sooner; a cancelled alarm calls
    nobody; a callback that raises is logged and the others still run."""
    trio.run(_callbacks, clock=trio.testing.MockClock(autojump_threshold=0))


async def _callbacks() -> None:
    called: dict[int, float] = {}

    def at(i: int) -> Callable[[], None]:
        def fn() -> None:
            called[i] = trio.current_time()
            if i == 3:
                raise RuntimeError("a bad callback")
        return fn

    start = trio.current_time()
    moments = {i: start + 0.1 + 0.01 * (i % 7) for i in range(20)}
    with trio.fail_after(5):
        entries = {i: call_at(t, at(i)) for i, t in moments.items()}
        cancel_alarm(entries[5])
        await trio.sleep(1.0)
    assert set(called) == set(moments) - {5}
    assert all(called[i] == pytest.approx(moments[i]) for i in called)
