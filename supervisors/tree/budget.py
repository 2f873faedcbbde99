"""The budget: money is reserved before a machine is rented, and the reservation is replaced by the
actual charge when the machine is gone. Pure arithmetic under a lock; no actors, no I/O.

    budget = Budget(10.0)
    r = budget.reserve(("train/seed-3", 0), 2.9 * 4200 / 3600)   # None: the budget cannot hold it
    budget.charge(r.holder, 0.12)          # live spend (a meter tick); False once it would cross
    budget.release(r.holder, 0.95)         # the machine is gone: 0.95 spent, the rest is free again

`reserve` and `release` answer the change they made (a `BudgetChange`, with its `seq` and the
totals after it), which the job supervisor records in the ledger and shows in its events.

The rule it keeps: `spent + reserved <= limit` at every moment, where `reserved` is the sum of the
live reservations and `spent` what released attempts cost. A reservation is refused when it would
break the rule; a live charge never counts beyond its reservation (the runtime guard stops the
attempt when a charge would cross it). Only a release whose actual cost is above its reservation
(a deletion the provider never confirmed, billed up to the machine's deadline) can push `spent`
past the limit; the budget then refuses every further reservation and says so in `overrun_usd`.

Amounts are held as whole micro-dollars (reservations and charges rounded up), so the rule holds
exactly, without float drift. Every change gets the next `seq` and is handed, inside the lock, to
`record` (the ledger queues it): the order of the ledger's rows is the order of the changes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import msgspec

MICRO = 1_000_000
Holder = tuple[str, int]  # (job key, attempt)


def to_micro(usd: float) -> int:
    """Dollars as whole micro-dollars, rounded up (a reservation or a charge is never understated)."""
    return max(0, math.ceil(round(usd * MICRO, 3)))


class BudgetChange(msgspec.Struct, frozen=True, kw_only=True):
    """One change, as the ledger records it: `kind` is reserve | release; `usd` is the amount
    reserved, or the actual charge that replaced the reservation; the totals are after it."""

    kind: str
    holder: Holder
    usd: float
    seq: int
    reserved_usd: float
    spent_usd: float
    limit_usd: float | None
    replaced_usd: float = 0.0  # a release: the reservation the charge replaced


class BudgetStatistics(msgspec.Struct, frozen=True, kw_only=True):
    limit_usd: float | None
    reserved_usd: float  # live reservations
    spent_usd: float  # what released attempts cost
    live_usd: float  # what the live attempts have cost so far (within their reservations)
    reservations: int
    refused: int  # reservations the budget could not hold
    overrun_usd: float  # spent past the limit (only an unconfirmed deletion can cause it)

    @property
    def left_usd(self) -> float:
        """What the limit leaves beside what was spent and what is reserved (0 limit: none set)."""
        return (self.limit_usd or 0.0) - self.spent_usd - self.reserved_usd


class Budget:
    """Thread-safe. `limit` None: every reservation fits (the figures are still kept)."""

    def __init__(self, limit_usd: float | None, *, spent_usd: float = 0.0,
                 record: Callable[[BudgetChange], None] | None = None) -> None:
        self._limit = None if limit_usd is None else math.floor(round(limit_usd * MICRO, 3))
        self._lock = threading.Lock()
        self._reserved: dict[Holder, int] = {}
        self._live: dict[Holder, int] = {}
        self._spent = to_micro(spent_usd)
        self._reserved_total = 0
        self._seq = 0
        self._refused = 0
        self._record = record

    # --- the three changes -----------------------------------------------------------------------

    def reserve(self, holder: Holder, usd: float) -> BudgetChange | None:
        """Reserve `usd` for `holder`; None if the budget cannot hold it (nothing changes then).
        A holder that already holds a reservation gets it back unchanged (a resume adopts one),
        with seq 0: no change was made."""
        amount = to_micro(usd)
        with self._lock:
            if holder in self._reserved:
                return self._change("reserve", holder, self._reserved[holder], seq=0)
            if self._limit is not None and self._spent + self._reserved_total + amount > self._limit:
                self._refused += 1
                return None
            self._reserved[holder] = amount
            self._live[holder] = 0
            self._reserved_total += amount
            return self._changed("reserve", holder, amount)

    def adopt(self, holder: Holder, usd: float) -> None:
        """Hold a reservation the ledger already has (a resume): counted, not recorded again, and
        taken even past the limit (it was made within it, against what was spent then)."""
        amount = to_micro(usd)
        with self._lock:
            if holder not in self._reserved:
                self._reserved[holder] = amount
                self._live[holder] = 0
                self._reserved_total += amount

    def charge(self, holder: Holder, usd: float) -> bool:
        """What `holder`'s live attempt has cost so far (a meter tick). False if it crossed its
        reservation: the guard stops the attempt. The figure kept never passes the reservation."""
        amount = to_micro(usd)
        with self._lock:
            cap = self._reserved.get(holder)
            if cap is None:
                return True  # released already (a late tick)
            self._live[holder] = min(amount, cap)
            return amount <= cap

    def release(self, holder: Holder, actual_usd: float) -> BudgetChange:
        """The machine is gone: the reservation is replaced by the actual charge. The change says
        which reservation it replaced (`replaced_usd`, 0 if `holder` held none: the charge is
        still spent)."""
        amount = to_micro(actual_usd)
        with self._lock:
            held = self._reserved.pop(holder, 0)
            self._live.pop(holder, None)
            self._reserved_total -= held
            self._spent += amount
            return self._changed("release", holder, amount, replaced=held)

    def spend(self, usd: float) -> None:
        """Money spent outside any reservation held here (a resume: what the run spent before)."""
        with self._lock:
            self._spent += to_micro(usd)

    def set_limit(self, limit_usd: float) -> None:
        """Set the limit of a budget made without one (a resume learns it from the jobs)."""
        with self._lock:
            if self._limit is None:
                self._limit = math.floor(round(limit_usd * MICRO, 3))

    def _changed(self, kind: str, holder: Holder, amount: int, replaced: int = 0) -> BudgetChange:
        self._seq += 1
        change = self._change(kind, holder, amount, seq=self._seq, replaced=replaced)
        if self._record is not None:
            self._record(change)
        return change

    def _change(self, kind: str, holder: Holder, amount: int, *, seq: int, replaced: int = 0) -> BudgetChange:
        return BudgetChange(kind=kind, holder=holder, usd=amount / MICRO, seq=seq,
                            reserved_usd=self._reserved_total / MICRO, spent_usd=self._spent / MICRO,
                            limit_usd=None if self._limit is None else self._limit / MICRO,
                            replaced_usd=replaced / MICRO)

    # --- reading -----------------------------------------------------------------------------------

    def fits(self, usd: float) -> bool:
        """Would a reservation of `usd` fit now (advice: another holder may take it first)?"""
        with self._lock:
            return self._limit is None or self._spent + self._reserved_total + to_micro(usd) <= self._limit

    def reserved_for(self, holder: Holder) -> float | None:
        with self._lock:
            held = self._reserved.get(holder)
            return None if held is None else held / MICRO

    def statistics(self) -> BudgetStatistics:
        with self._lock:
            overrun = 0 if self._limit is None else max(0, self._spent - self._limit)
            return BudgetStatistics(
                limit_usd=None if self._limit is None else self._limit / MICRO,
                reserved_usd=self._reserved_total / MICRO, spent_usd=self._spent / MICRO,
                live_usd=sum(self._live.values()) / MICRO, reservations=len(self._reserved),
                refused=self._refused, overrun_usd=overrun / MICRO)


def reservation_usd(hourly_usd: float, hold_s: float) -> float:
    """What holding a machine at `hourly_usd` for `hold_s` seconds costs (an attempt's hold_s is
    protocols/attempt_time.py's)."""
    return hourly_usd * hold_s / 3600.0
