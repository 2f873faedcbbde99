"""CostMeterActor: price x time for one machine, capped at its deadline.

`StartMeter(machine, at)` starts the clock (the parent sends it on `Leased`); then, on the
reactor's shared clock of `meter_period_s`, the meter emits `Metered(usd)` on the event bus, where
the budget guard (the Runner's) and the view read it: no chain of tells up the tree for a number
nobody there needs. The figure is made on the reactor thread, in the clock's pass (`_LiveFigure`:
the price, the start and the `ending` flag, all fixed once metering starts), not in a turn of the
meter's: a tell and a turn per beat per machine were most of what a running attempt's meter cost.
`StopMeter(at, confirmed)` (asked) answers the final `Usage`: up to the deletion when it was
confirmed; up to the machine's deadline otherwise, marked `at_least` (the provider may bill more).

The runtime guard: a `StartMeter` with `reserved_usd` (the money the job supervisor set aside
before the lease) arms a timer for the moment the machine's cost would reach that reservation,
less the time a release takes (`release_allowance_s`: the machine bills until it is gone). When it
fires, the meter tells its parent `Cancel(budget)`: the attempt stops and its machine is deleted,
so what the attempt costs stays within what was reserved. A timer, not the ticks: the price is
fixed, so the moment is known, and a tick period of seconds would overshoot by as much.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pykka

from actor_run.actors.base import Actor, Context
from actor_run.actors.flag import Flag
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    AttemptHead,
    Cancel,
    Event,
    Machine,
    Message,
    Metered,
    StartMeter,
    StopMeter,
    Usage,
)

RELEASE_ALLOWANCE_S = 20.0  # at most this long (and a tenth of the reserved time) is kept for the release


class _LiveFigure:
    """The meter's beat, on the reactor thread (a clock subscription's): `Metered` on the event bus
    (whose subscribers take events from any thread). Declines (the clock drops it) once the attempt
    is ending: no live figure may pass the delete."""

    __slots__ = ("emit", "ending", "head", "machine", "reserved_usd", "started")

    def __init__(self, emit: Callable[[Event], None], head: AttemptHead, machine: Machine, started: float,
                 reserved_usd: float, ending: Flag | None) -> None:
        self.emit, self.head, self.machine, self.started = emit, head, machine, started
        self.reserved_usd, self.ending = reserved_usd, ending

    def __call__(self) -> bool:
        now = time.time()  # read before `ending`: a figure made is of a moment before the delete
        if self.ending is not None and self.ending.is_set():
            return False
        usage = usage_between(self.machine, self.started, now, confirmed=True)
        self.emit(Metered(**self.head, usd=usage.usd, reserved_usd=self.reserved_usd))
        return True


class _Guard(Message, frozen=True, kw_only=True):
    pass


def guard_after_s(hourly_usd: float, reserved_usd: float) -> float:
    """Seconds after the meter's start at which the guard stops the attempt: the reserved time,
    less what the release needs."""
    reserved_s = reserved_usd * 3600.0 / hourly_usd
    return max(0.0, reserved_s - min(RELEASE_ALLOWANCE_S, reserved_s / 10))


def usage_between(machine: Machine, start: float, end: float, *, confirmed: bool, billed_s: float = -1.0) -> Usage:
    """What a machine cost from `start` to `end` (at most its deadline; all of it if unconfirmed).
    A run billed by the second (`billed_s` >= 0: a serverless worker's execution time) costs those
    seconds at the machine's rate, at most up to the deadline."""
    if billed_s >= 0:
        cap = machine.deadline - start if machine.deadline > 0 else billed_s
        seconds = max(0.0, min(billed_s, cap))
        return Usage(usd=machine.hourly_usd * seconds / 3600.0, seconds=seconds, at_least=not confirmed)
    if not confirmed and machine.deadline > 0:
        end = max(end, machine.deadline)
    elif machine.deadline > 0:
        end = min(end, machine.deadline)
    seconds = max(0.0, end - start)
    return Usage(usd=machine.hourly_usd * seconds / 3600.0, seconds=seconds, at_least=not confirmed)


class CostMeterActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int,
                 ending: Flag | None = None) -> None:
        super().__init__(ctx, parent, f"meter:{job}/{seed}/a{attempt}")
        # the attempt's: set once its release began (the delete may be out): no live figure after it
        self.ending = ending
        self.head: AttemptHead = {"job": job, "seed": seed, "attempt": attempt}
        self.machine: Machine | None = None
        self.started = 0.0
        self.final: Usage | None = None
        self.reserved_usd: float | None = None

    def handle(self, message: Any) -> Any:
        match message:
            case StartMeter(machine=machine, at=at, reserved_usd=reserved):
                self.machine, self.started, self.reserved_usd = machine, at, reserved
                if machine.hourly_usd > 0:  # one clock for every meter, its pass makes the figures
                    figure = _LiveFigure(self.ctx.emit, self.head, machine, at, reserved or 0.0, self.ending)
                    self.on_clock(self.ctx.meter_period_s, figure)
                    if reserved is not None:
                        due = at + guard_after_s(machine.hourly_usd, reserved)
                        self.later(max(0.0, due - time.time()), _Guard())
            case _Guard():
                if self.machine is not None and self.final is None and self.reserved_usd is not None:
                    usage = usage_between(self.machine, self.started, time.time(), confirmed=True)
                    self.tell_parent(Cancel(failure=Code.BUDGET, detail=(
                        f"the attempt's spend reached its reservation (${usage.usd:.4f} of"
                        f" ${self.reserved_usd:.4f}, keeping time to delete the machine)")))
            case StopMeter(at=at, confirmed=confirmed):
                self.cancel_tasks()  # first: no live figure once the final one is made
                if self.final is None:
                    if self.machine is None:
                        self.final = Usage()
                    else:
                        self.final = usage_between(self.machine, self.started, at, confirmed=confirmed)
                return self.final
            case _:
                raise TypeError(f"CostMeterActor cannot handle {message!r}")
        return None
