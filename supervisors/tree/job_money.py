"""The money of one job's attempts (job.py's JobSupervisor holds one `JobMoney`).

Before each lease an attempt's reservation (the offer's price x the longest it may hold the
machine, budget.py `reservation_usd`) is taken from the seed's own ceiling (`max_usd`, counting
what its attempts cost before a resume) and then from the batch's budget (shared by its jobs); a
refusal says, in a line, which one was short and by how much. A reservation held (and, when the
policy names one, held by the team budget too: team_hold.py) is recorded in the ledger and said as
`Reserved`; when the attempt ends it is replaced by what the attempt cost, recorded and said as
`Charged`.

Used on its job's actor thread (a Budget is arithmetic under its own lock: any thread may read it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from actor_run.actors import Context
from actor_run.protocols.messages import AttemptEnded, Charged, JobHead, Offer, Reserved
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.tree.budget import Budget, BudgetChange, Holder


class JobMoney:
    def __init__(self, ctx: Context, ledger: Ledger, head: JobHead, key: str, *, budget: Budget | None,
                 max_usd: float | None, spent_before_usd: float = 0.0) -> None:
        self.ctx, self.ledger, self.head, self.key = ctx, ledger, head, key
        self.budget = budget if budget is not None else Budget(None)  # the batch's, shared by its jobs
        # the seed's own ceiling, counting what its attempts cost before a resume
        self.seed = Budget(max_usd, spent_usd=spent_before_usd) if max_usd is not None else None
        self.reserved: float | None = None  # the running attempt's reservation

    @property
    def budgets(self) -> tuple[Budget, Budget | None]:
        return self.budget, self.seed

    def capped(self) -> bool:
        """Whether a limit (the batch's or the seed's) bounds what an attempt may spend."""
        return any(b is not None and b.statistics().limit_usd is not None for b in self.budgets)

    def adopt(self, attempt: int, usd: float | None) -> float:
        """An adopted attempt runs already: its reservation as the Runner adopted it from the ledger,
        or, for a ledger without one, `usd` (the machine's price up to its deadline)."""
        holder = (self.key, attempt)
        reserved = self.budget.reserved_for(holder)
        if reserved is None:
            reserved = usd or 0.0
            self.budget.adopt(holder, reserved)
        if self.seed is not None:
            self.seed.adopt(holder, reserved)
        self.reserved = reserved
        return reserved

    def reserve(self, attempt: int, usd: float, where: str) -> BudgetChange | str:
        """Reserve `usd` for an attempt on the offer at `where`: the seed's ceiling first, then the
        batch's. The change (recorded nowhere yet: `record`), or the line saying which was short."""
        holder = (self.key, attempt)
        if self.seed is not None and self.seed.reserve(holder, usd) is None:
            return f"{where} needs ${usd:.2f}; the seed's max_usd has ${self.seed.statistics().left_usd:.2f} left"
        change = self.budget.reserve(holder, usd)
        if change is None:
            if self.seed is not None:
                self.seed.release(holder, 0.0)
            return f"{where} needs ${usd:.2f}; the budget has ${self.budget.statistics().left_usd:.2f} left"
        return change

    def record(self, attempt: int, offer: Offer, change: BudgetChange, hold_s: float, team: str | None = None) -> None:
        """The reservation holds (`team`: the team budget that held it too): to the ledger, out as `Reserved`."""
        self.ledger.record_reserved(job=self.key, attempt=attempt, offer=offer, hold_s=hold_s,
                                    usd=change.usd, seq=change.seq, limit_usd=change.limit_usd, budget=team)
        if change.usd > 0 or change.limit_usd is not None:  # a free machine under no budget: no money to show
            self.ctx.emit(Reserved(**self.head, attempt=attempt, usd=change.usd, offer=offer,
                                   hold_s=round(hold_s, 3), **_totals(change)))
        self.reserved = change.usd

    def charge(self, e: AttemptEnded, then: Callable[[], None] | None = None) -> None:
        """The attempt ended: its machine is gone, and its reservation is replaced by what it cost
        (`then()` once the ledger committed that: ledger/money.py `record_charged`)."""
        holder = (self.key, e.attempt)
        if self.seed is not None:
            self.seed.release(holder, e.usage.usd)
        change = self.budget.release(holder, e.usage.usd)
        self.reserved = None
        self.ledger.record_charged(job=self.key, attempt=e.attempt, usd=e.usage.usd, at_least=e.usage.at_least,
                                   seq=change.seq, seconds=e.usage.seconds, outcome=e.outcome,
                                   failure=e.failure, then=then)
        if change.replaced_usd > 0 or e.usage.usd > 0 or change.limit_usd is not None:
            self.ctx.emit(Charged(**self.head, attempt=e.attempt, usd=change.usd, reserved=change.replaced_usd,
                                  at_least=e.usage.at_least, **_totals(change)))

    def forfeit(self, attempt: int) -> None:
        """The job failed (a bug) with an attempt running: what it set aside counts as spent (its cost is unknown)."""
        if self.reserved is None:
            return
        holder: Holder = (self.key, attempt)
        for b in self.budgets:
            if b is not None:
                b.release(holder, self.reserved)
        self.reserved = None


class _TotalsDict(TypedDict):
    spent_usd: float
    reserved_usd: float
    budget_usd: float | None


def _totals(change: BudgetChange) -> _TotalsDict:
    """The batch's figures after a change, as the Reserved / Charged events carry them."""
    return {"spent_usd": round(change.spent_usd, 6), "reserved_usd": round(change.reserved_usd, 6),
            "budget_usd": change.limit_usd}


__all__ = ["JobMoney"]
