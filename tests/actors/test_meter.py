"""The cost meter (actors/meter.py): `usage_between`, a pure function, and the actor around it."""

from __future__ import annotations

import math
import time
from typing import Any

import pykka
import pytest
from actor_kit import Mailbox, ProbeHandle
from hypothesis import given
from hypothesis import strategies as st

from actor_run.actors import Context, CostMeterActor, usage_between
from actor_run.actors.flag import Flag
from actor_run.actors.pool import POOL
from actor_run.protocols.messages import ChildFailed, Machine, Metered, StartMeter, StopMeter, Usage

T0 = 1_700_000_000.0
prices = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
offsets = st.floats(min_value=0.0, max_value=30 * 24 * 3600.0, allow_nan=False)


def machine(hourly_usd: float, deadline: float, name: str = "m") -> Machine:
    return Machine(cloud="sim", id=name, name=name, hourly_usd=hourly_usd, deadline=deadline)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@given(price=prices, run=offsets, life=offsets)
def test_confirmed_usage_is_price_times_seconds_capped_at_the_deadline(
    price: float, run: float, life: float,
) -> None:
    start, end, deadline = T0, T0 + run, T0 + life
    u = usage_between(machine(price, deadline), start, end, confirmed=True)
    seconds = min(end, deadline) - start
    assert close(u.seconds, seconds)
    assert close(u.usd, price * seconds / 3600)
    assert u.at_least is False


@given(price=prices, run=offsets, extra=offsets)
def test_unconfirmed_usage_is_billed_to_the_deadline_and_says_at_least(
    price: float, run: float, extra: float,
) -> None:
    start, end = T0, T0 + run
    deadline = end + extra  # the deletion was tried before the deadline: the machine may live until it
    u = usage_between(machine(price, deadline), start, end, confirmed=False)
    assert close(u.seconds, deadline - start)
    assert close(u.usd, price * (deadline - start) / 3600)
    assert u.at_least is True


@given(price=prices, run=offsets, life=offsets)
def test_unconfirmed_never_costs_less_than_confirmed(price: float, run: float, life: float) -> None:
    m = machine(price, T0 + life)
    sure = usage_between(m, T0, T0 + run, confirmed=True)
    maybe = usage_between(m, T0, T0 + run, confirmed=False)
    assert maybe.usd >= sure.usd
    assert maybe.seconds >= sure.seconds


@given(price=prices, run=offsets, confirmed=st.booleans())
def test_without_a_deadline_usage_runs_to_the_end(price: float, run: float, confirmed: bool) -> None:
    start, end = T0, T0 + run
    u = usage_between(machine(price, 0.0), start, end, confirmed=confirmed)
    assert close(u.seconds, end - start)
    assert close(u.usd, price * (end - start) / 3600)
    assert u.at_least is (not confirmed)


@given(price=prices, back=st.floats(min_value=0.0, max_value=1e6, allow_nan=False), confirmed=st.booleans())
def test_an_end_before_the_start_costs_nothing(price: float, back: float, confirmed: bool) -> None:
    u = usage_between(machine(price, 0.0), T0, T0 - back, confirmed=confirmed)
    assert u.seconds == 0.0
    assert u.usd == 0.0


def test_usage_examples() -> None:
    m = machine(3.6, T0 + 100)  # a tenth of a cent a second
    def figures(u: Usage) -> tuple[float, float, bool]:
        return round(u.usd, 9), u.seconds, u.at_least

    assert figures(usage_between(m, T0, T0 + 10, confirmed=True)) == (0.01, 10.0, False)
    assert figures(usage_between(m, T0, T0 + 500, confirmed=True)) == (0.1, 100.0, False)  # the deadline caps
    assert figures(usage_between(m, T0, T0 + 10, confirmed=False)) == (0.1, 100.0, True)


# --- the actor -------------------------------------------------------------------------------------


def start_meter(ctx: Context, probe: ProbeHandle, job: str = "t", ending: Flag | None = None) -> pykka.ActorRef[Any]:
    return CostMeterActor.start(ctx, probe.ref, job=job, seed=1, attempt=0, ending=ending)


def stop_meter(meter: pykka.ActorRef[Any], at: float, *, confirmed: bool) -> Usage:
    usage = meter.ask(StopMeter(at=at, confirmed=confirmed), timeout=10)
    assert isinstance(usage, Usage)
    return usage


def test_stop_meter_answers_the_usage_up_to_the_deletion(ctx: Context, probe: ProbeHandle) -> None:
    meter = start_meter(ctx, probe)
    try:
        at = time.time()
        meter.tell(StartMeter(machine=machine(36.0, at + 3600), at=at))
        usage = stop_meter(meter, at + 50, confirmed=True)
        assert usage.usd == pytest.approx(0.5)
        assert usage.seconds == pytest.approx(50.0)
        assert usage.at_least is False
        # asked again (a retried ask), it answers the same final figure
        assert stop_meter(meter, at + 500, confirmed=True) == usage
    finally:
        meter.stop()


def test_stop_meter_unconfirmed_bills_to_the_deadline(ctx: Context, probe: ProbeHandle) -> None:
    meter = start_meter(ctx, probe)
    try:
        at = time.time()
        meter.tell(StartMeter(machine=machine(3.6, at + 1000), at=at))
        usage = stop_meter(meter, at + 10, confirmed=False)
        assert usage.usd == pytest.approx(1.0)
        assert usage.seconds == pytest.approx(1000.0)
        assert usage.at_least is True
    finally:
        meter.stop()


def test_stop_meter_before_any_machine_costs_nothing(ctx: Context, probe: ProbeHandle) -> None:
    meter = start_meter(ctx, probe)
    try:
        assert stop_meter(meter, time.time(), confirmed=False) == Usage()
    finally:
        meter.stop()


def test_a_priced_machine_is_metered_on_the_event_bus_periodically(
    ctx: Context, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    """meter_period_s is 0.2 here: two beats in a row, rising; a free machine next to it says nothing.
    Metered goes to ctx.emit (where the Runner's budget guard reads it), not up the tree."""
    priced, free = start_meter(ctx, probe, "priced"), start_meter(ctx, probe, "free")
    try:
        at = time.time()
        free.tell(StartMeter(machine=machine(0.0, at + 3600, "free"), at=at))
        priced.tell(StartMeter(machine=machine(3600.0, at + 3600, "priced"), at=at))
        first = emitted.wait_for(Metered, where=lambda m: m.job == "priced")
        second = emitted.wait_for(Metered, where=lambda m: m.job == "priced")
        assert (first.seed, first.attempt) == (1, 0)
        assert 0 < first.usd < second.usd
        assert second.t - first.t >= 0.1  # periodic, not a burst
        assert not [m for m in emitted.of(Metered) if m.job == "free"]
        usage = stop_meter(priced, time.time(), confirmed=True)
        assert usage.usd >= second.usd
        assert not probe.box.of(Metered)
    finally:
        priced.stop()
        free.stop()


def test_the_live_figures_cost_the_meter_no_turn(ctx: Context, probe: ProbeHandle, emitted: Mailbox) -> None:
    """The figure is made in the shared clock's pass on the reactor thread and goes straight to the
    event bus: no tell to the meter nor turn of its own per beat (bench/RESULTS.md item 67: a tell
    and a turn per running machine per beat)."""
    meter = start_meter(ctx, probe, "priced")
    try:
        at = time.time()
        meter.tell(StartMeter(machine=machine(3600.0, at + 3600, "priced"), at=at))
        emitted.wait_for(Metered, where=lambda m: m.job == "priced")
        before = POOL.statistics()["messages"]
        figures = [emitted.wait_for(Metered, where=lambda m: m.job == "priced") for _ in range(3)]
        assert POOL.statistics()["messages"] == before  # three beats, no message handled
        assert figures[0].usd < figures[1].usd < figures[2].usd
        assert meter.is_alive()
    finally:
        meter.stop()


def test_no_metered_after_stop_meter(ctx: Context, probe: ProbeHandle, emitted: Mailbox) -> None:
    priced, sentinel = start_meter(ctx, probe, "stopped"), start_meter(ctx, probe, "sentinel")
    try:
        at = time.time()
        priced.tell(StartMeter(machine=machine(3600.0, at + 3600, "stopped"), at=at))
        emitted.wait_for(Metered, where=lambda m: m.job == "stopped")
        stop_meter(priced, time.time(), confirmed=True)
        stopped_at = time.time()
        # the sentinel starts now: by its second beat the stopped meter had two periods to beat again
        sentinel.tell(StartMeter(machine=machine(3600.0, at + 3600, "sentinel"), at=time.time()))
        emitted.wait_for(Metered, where=lambda m: m.job == "sentinel")
        emitted.wait_for(Metered, where=lambda m: m.job == "sentinel")
        assert [m.t for m in emitted.of(Metered) if m.job == "stopped" and m.t >= stopped_at] == []
    finally:
        priced.stop()
        sentinel.stop()


def test_no_metered_once_the_attempt_is_ending_before_the_meter_is_stopped(
    ctx: Context, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    """The attempt sets its `ending` flag as its release begins (the Release is urgent and may reach
    the lease before the meter's stop has its turn): from then on no live figure, though the meter
    still runs."""
    ending = Flag()
    priced, sentinel = start_meter(ctx, probe, "ending", ending), start_meter(ctx, probe, "sentinel")
    try:
        at = time.time()
        priced.tell(StartMeter(machine=machine(3600.0, at + 3600, "ending"), at=at))
        emitted.wait_for(Metered, where=lambda m: m.job == "ending")
        ending.set()
        ended_at = time.time()
        sentinel.tell(StartMeter(machine=machine(3600.0, at + 3600, "sentinel"), at=time.time()))
        emitted.wait_for(Metered, where=lambda m: m.job == "sentinel")
        emitted.wait_for(Metered, where=lambda m: m.job == "sentinel")
        assert priced.is_alive()
        assert [m.usd for m in emitted.of(Metered) if m.job == "ending" and m.t >= ended_at] == []
    finally:
        priced.stop()
        sentinel.stop()


def test_an_unknown_message_fails_the_meter_and_tells_the_parent(ctx: Context, probe: ProbeHandle) -> None:
    meter = start_meter(ctx, probe)
    try:
        meter.tell("what is this")
        failed = probe.wait_for(ChildFailed)
        assert failed.child == "meter:t/1/a0"
        assert "TypeError" in failed.detail
        assert meter.actor_stopped.wait(10)
    finally:
        meter.stop()
