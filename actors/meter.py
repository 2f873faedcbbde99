"""CostMeterActor: price x time for one machine, capped at its deadline.

`StartMeter(machine, at)` starts the clock (the parent sends it on `Leased`); then, on the
reactor's shared clock of `meter_period_s`, the meter emits `Metered(usd)` on the event bus, where
the budget guard (the Runner's) and the view read it: no chain of tells up the tree for a number
nobody there needs.
`StopMeter(at, confirmed)` (asked) answers the final `Usage`: up to the deletion when it was
confirmed; up to the machine's deadline otherwise, marked `at_least` (the provider may bill more).
"""

from __future__ import annotations

import time
from typing import Any

import pykka

from actor_run.actors.base import Actor, Context
from actor_run.protocols.messages import AttemptHead, Machine, Message, Metered, StartMeter, StopMeter, Usage


class _Beat(Message, frozen=True, kw_only=True):
    pass


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
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int) -> None:
        super().__init__(ctx, parent, f"meter:{job}/{seed}/a{attempt}")
        self.head: AttemptHead = {"job": job, "seed": seed, "attempt": attempt}
        self.machine: Machine | None = None
        self.started = 0.0
        self.final: Usage | None = None

    def handle(self, message: Any) -> Any:
        match message:
            case StartMeter(machine=machine, at=at):
                self.machine, self.started = machine, at
                if machine.hourly_usd > 0:
                    self.every(self.ctx.meter_period_s, _Beat())  # one clock for every meter
            case _Beat():
                if self.machine is not None and self.final is None:
                    usage = usage_between(self.machine, self.started, time.time(), confirmed=True)
                    self.ctx.emit(Metered(**self.head, usd=usage.usd))
            case StopMeter(at=at, confirmed=confirmed):
                if self.final is None:
                    if self.machine is None:
                        self.final = Usage()
                    else:
                        self.final = usage_between(self.machine, self.started, at, confirmed=confirmed)
                self.cancel_tasks()
                return self.final
            case _:
                raise TypeError(f"CostMeterActor cannot handle {message!r}")
        return None
