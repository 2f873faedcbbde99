"""Shared clocks on the reactor: `await tick(period)` sleeps until the next beat of one clock per
period, shared by every loop of that period in this trio run.

Why: a thousand watched jobs each sleeping `poll_s` on their own cost a thousand trio sleeps per
period (a cancel scope, a deadline in the heap and a `Cancelled` raised and caught, each), most of
the reactor's time at load (bench/RESULTS.md). Parked on one clock, the same loops cost one sleep
per period and a cheap wake-up each. A loop's first wait is shorter than `period` (until the next
beat); after that it runs once per period. A clock whose beat finds nobody waiting stops, so an
idle reactor has no ticking task.
"""

from __future__ import annotations

import trio

_CLOCKS: trio.lowlevel.RunVar[dict[float, _Clock]] = trio.lowlevel.RunVar("actor_run_clocks")


class _Clock:
    __slots__ = ("lot", "period")

    def __init__(self, period: float) -> None:
        self.period = period
        self.lot = trio.lowlevel.ParkingLot()

    async def run(self, clocks: dict[float, _Clock]) -> None:
        while True:
            await trio.sleep(self.period)
            if not self.lot:  # nobody waits: stop (a later tick() starts a new clock)
                del clocks[self.period]
                return
            self.lot.unpark_all()


async def tick(period: float) -> None:
    """Wait for the next beat of the shared clock of `period` seconds (cancellable)."""
    try:
        clocks = _CLOCKS.get()
    except LookupError:
        clocks = {}
        _CLOCKS.set(clocks)
    clock = clocks.get(period)
    if clock is None:
        clock = clocks[period] = _Clock(period)
        trio.lowlevel.spawn_system_task(clock.run, clocks, name=f"actor-run clock {period:g} s")
    await clock.lot.park()
