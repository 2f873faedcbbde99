"""Shared clocks on the reactor: `await tick(period)` sleeps until the next beat of one clock per
period, shared by every loop of that period in this trio run.

Why: a thousand watched jobs each sleeping `poll_s` on their own cost a thousand trio sleeps per
period (a cancel scope, a deadline in the heap and a `Cancelled` raised and caught, each), most of
the reactor's time at load (bench/RESULTS.md). Parked on one clock, the same loops cost one sleep
per period and a cheap wake-up each. A loop's first wait is shorter than `period` (until the next
beat); after that it runs once per period. A clock whose beat finds nobody waiting stops, so an
idle reactor has no ticking task.

`Ticker.wait_until(at)` is a loop's one wait for a moment of its own (a virtual job's known end): an
entry in one heap per trio run, served by one task that sleeps until the earliest is due, not a trio
sleep per loop (its cancel scope, deadline and `Cancelled` each: ten thousand jobs ending in a burst
paid them each; the entries due by the time the task wakes are woken together).

`subscribe(period, beat)` is the same clock for what needs no task of its own: `beat()` is called on
the reactor thread at every beat (a meter's tell), until it returns False or the subscription is
cancelled (from any thread). A thousand meters cost no thousand tasks to start, wake and cancel.
Ten thousand heartbeats of a virtual machine step there too (actors/heartbeat.py): the clock's one
pass polls them all, where each was a task trio rescheduled and switched to. The beats keep a fixed
grid, so a long pass does not stretch the period; `call_at(at, fn)` is `wait_until` for such a
subscriber: `fn()` called from the heap of alarms at that moment.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

import trio

from actor_run.protocols.logs import logger

_CLOCKS: trio.lowlevel.RunVar[dict[float, _Clock]] = trio.lowlevel.RunVar("actor_run_clocks")
_ALARMS: trio.lowlevel.RunVar[_Alarms] = trio.lowlevel.RunVar("actor_run_alarms")
_seq = itertools.count()


class Subscription:
    """A `beat` called at every beat of one clock until it returns False or `cancel()` is called."""

    __slots__ = ("beat", "cancelled")

    def __init__(self, beat: Callable[[], bool]) -> None:
        self.beat = beat
        self.cancelled = False

    def cancel(self) -> None:
        """From any thread: no beat after the one that may be running now."""
        self.cancelled = True

    def _keep(self) -> bool:
        if self.cancelled:
            return False
        try:
            return self.beat()
        except Exception as exc:  # one bad subscriber must not stop the clock for the others
            logger.error("a clock subscriber failed and was dropped: {}", exc)
            return False


class _Clock:
    __slots__ = ("parked", "period", "subs")

    def __init__(self, period: float) -> None:
        self.period = period
        self.parked: dict[trio.lowlevel.Task, None] = {}  # the tasks waiting for the next beat
        self.subs: list[Subscription] = []

    async def run(self, clocks: dict[float, _Clock]) -> None:
        # beats on a fixed grid (`period` apart, not `period` after the last beat's work): what its
        # subscribers do at a beat (a pass that polls ten thousand jobs) must not stretch the period
        beat = trio.current_time()
        while True:
            beat += self.period
            now = trio.current_time()
            if beat <= now:  # a whole period behind (a busy reactor): no burst of beats to catch up
                beat = now + self.period
            await trio.sleep_until(beat)
            if self.subs:
                self.subs = [sub for sub in self.subs if sub._keep()]
            if not self.parked and not self.subs:  # nobody waits: stop (a later tick() starts a new clock)
                del clocks[self.period]
                return
            parked, self.parked = self.parked, {}
            for task in parked:
                trio.lowlevel.reschedule(task)

    def park(self, abort: Callable[[trio.lowlevel.RaiseCancelT], trio.lowlevel.Abort]) -> Coroutine[Any, Any, Any]:
        """The current task waits for the next beat: await what this returns at once. `abort` must take
        the task out of `parked` (trio calls it on a cancel)."""
        self.parked[trio.lowlevel.current_task()] = None
        return trio.lowlevel.wait_task_rescheduled(abort)  # noqa: ASYNC105 (the caller awaits it at once: a coroutine less per wait)


Alarm = list[trio.lowlevel.Task | Callable[[], None] | None]  # one entry: [whom it wakes, or None once it left]


class _Alarms:
    """The moments loops wait for, in one heap; one task sleeps until the earliest is due."""

    __slots__ = ("heap", "running", "scope")

    def __init__(self) -> None:
        # (due on trio's clock, order, [the waiting task or the callback, or None once it left])
        self.heap: list[tuple[float, int, Alarm]] = []
        self.scope: trio.CancelScope | None = None  # the task's sleep, until the earliest is due
        self.running = False

    def add(self, at: float, task: trio.lowlevel.Task | Callable[[], None]) -> Alarm:
        entry: Alarm = [task]
        heapq.heappush(self.heap, (at, next(_seq), entry))
        if not self.running:
            self.running = True
            trio.lowlevel.spawn_system_task(self.run, name="actor-run alarms")
        elif self.scope is not None and at < self.scope.deadline:
            self.scope.deadline = at
        return entry

    async def run(self) -> None:
        heap = self.heap
        try:
            while heap:
                with trio.CancelScope(deadline=heap[0][0]) as scope:
                    self.scope = scope
                    await trio.sleep_forever()
                self.scope = None
                now = trio.current_time()
                while heap and heap[0][0] <= now:
                    entry = heapq.heappop(heap)[2]
                    task, entry[0] = entry[0], None
                    if isinstance(task, trio.lowlevel.Task):
                        trio.lowlevel.reschedule(task)
                    elif task is not None:
                        try:
                            task()
                        except Exception as exc:  # one bad callback must not stop the alarms of the others
                            logger.error("an alarm's callback failed: {}", exc)
        finally:
            self.running = False
            self.scope = None


def _alarms() -> _Alarms:
    try:
        return _ALARMS.get()
    except LookupError:
        alarms = _Alarms()
        _ALARMS.set(alarms)
        return alarms


def _clock(period: float) -> _Clock:
    try:
        clocks = _CLOCKS.get()
    except LookupError:
        clocks = {}
        _CLOCKS.set(clocks)
    clock = clocks.get(period)
    if clock is None:
        clock = clocks[period] = _Clock(period)
        trio.lowlevel.spawn_system_task(clock.run, clocks, name=f"actor-run clock {period:g} s")
    return clock


async def tick(period: float) -> None:
    """Wait for the next beat of the shared clock of `period` seconds (cancellable)."""
    clock = _clock(period)
    task = trio.lowlevel.current_task()

    def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        clock.parked.pop(task, None)
        return trio.lowlevel.Abort.SUCCEEDED

    await clock.park(abort)


class Ticker:
    """One loop's waits on the shared clock of `period`, made for a loop that waits there for its whole
    life (a heartbeat's). `await ticker.wait()` is `await tick(period)` with less made per wait:
    `tick` makes about ten objects the collector tracks (its coroutine and a ParkingLot's, an abort
    closure and its cell...) that live until the beat, so at N=10,000 watched jobs the young
    generation held 100,000 of them at every pass of the collector, about 35 ms each, every 0.3 s
    (bench/RESULTS.md item 49). A wait here makes trio's own trap and nothing else. On the reactor
    thread only; one wait at a time."""

    __slots__ = ("_abort", "_alarm", "_clock", "_task", "period")

    def __init__(self, period: float) -> None:
        self.period = period
        self._clock: _Clock | None = None
        self._task: trio.lowlevel.Task | None = None
        self._alarm: Alarm | None = None  # the entry of a `wait_until` in progress
        self._abort = self._aborted  # one bound method for every wait, not one per wait

    def wait(self) -> Coroutine[Any, Any, Any]:
        """The current task waits for the next beat: `await ticker.wait()`, at once (the task is on the
        clock from this call on; cancellable)."""
        clock = self._clock = _clock(self.period)
        self._task = trio.lowlevel.current_task()
        self._alarm = None
        return clock.park(self._abort)

    def wait_until(self, at: float) -> Coroutine[Any, Any, Any]:
        """The current task waits until `at` (trio's clock), on the run's one heap of alarms:
        `await ticker.wait_until(at)`, at once (cancellable). Due already: at the alarms' next turn."""
        task = self._task = trio.lowlevel.current_task()
        self._clock = None
        self._alarm = _alarms().add(at, task)
        return trio.lowlevel.wait_task_rescheduled(self._abort)  # noqa: ASYNC105 (awaited at once by the caller)

    def _aborted(self, _: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        if self._alarm is not None:  # a wait_until: its entry wakes nobody now
            self._alarm[0] = None
            self._alarm = None
        if self._clock is not None and self._task is not None:
            self._clock.parked.pop(self._task, None)
        return trio.lowlevel.Abort.SUCCEEDED


def call_at(at: float, fn: Callable[[], None]) -> Alarm:
    """On the reactor thread (inside its trio run): call `fn()` there at `at` (trio's clock), from
    the run's one heap of alarms (no task, no sleep of its own); `fn` must not wait. Due already: at
    the alarms' next turn. `cancel_alarm(entry)` calls it off. A raise is logged, and no other
    alarm is hurt."""
    return _alarms().add(at, fn)


def cancel_alarm(entry: Alarm) -> None:
    """On the reactor thread: the alarm `call_at` made calls nobody now."""
    entry[0] = None


def subscribe(period: float, sub: Subscription) -> None:
    """On the reactor thread (inside its trio run): call `sub.beat()` at every beat of `period`."""
    if not sub.cancelled:
        _clock(period).subs.append(sub)
