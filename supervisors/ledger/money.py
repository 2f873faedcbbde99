"""What the ledger records of money: reservations before a lease, and what each attempt was
charged in their place (supervisors/tree/budget.py decides them; supervisors/tree/reservations.py
settles a dead owner's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from actor_run.protocols.messages import Offer
from actor_run.supervisors.ledger.core import LedgerCore


class MoneyRecords(LedgerCore):
    """The ledger's writes about reservations and charges (a part of `Ledger`)."""

    def reservation_row(self, *, job: str, attempt: int, offer: Offer, hold_s: float, usd: float, seq: int,
                        limit_usd: float | None) -> dict[str, Any]:
        """A reservation as its row's columns (what team.hold writes in its own transaction)."""
        return {"run": self.run_of(job), "job": job, "attempt": attempt, "owner": self.owner, "cloud": offer.cloud,
                "account": offer.account, "region": offer.region, "gpu": offer.gpu, "hourly_usd": offer.hourly_usd,
                "hold_s": hold_s, "usd": usd, "state": "live", "seq": seq, "reserved_at": time.time(),
                "limit_usd": limit_usd}

    def record_reserved(self, *, job: str, attempt: int, offer: Offer, hold_s: float, usd: float, seq: int,
                        limit_usd: float | None, budget: str | None = None) -> None:
        """Queued, not waited for: the attempt's intent is queued after it, and commits after it.
        `budget`: the team budget it was held against (team.hold wrote the row already: kept)."""
        row = (*self.reservation_row(job=job, attempt=attempt, offer=offer, hold_s=hold_s, usd=usd, seq=seq,
                                     limit_usd=limit_usd).values(), budget)
        self._submit((
            "INSERT OR REPLACE INTO reservations (run, job, attempt, owner, cloud, account, region, gpu, hourly_usd,"
            " hold_s, usd, state, seq, reserved_at, limit_usd, budget) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            row), fence=job)

    def record_charged(self, *, job: str, attempt: int, usd: float, at_least: bool, seq: int, seconds: float,
                       outcome: str, failure: str | None, then: Callable[[], None] | None = None) -> None:
        """The reservation is replaced by what the attempt cost (its machine's seconds, its outcome).
        `then()`: called once the change is committed (or failed), on the writer thread: it must only
        hand the news on (a team budget's waiters may look for the room it made)."""
        row = (usd, int(at_least), seq, time.time(), seconds, outcome, failure, self.run_of(job), job, attempt)
        op = ("UPDATE reservations SET state='released', charged=?, at_least=?, released_seq=?, released_at=?,"
              " seconds=?, outcome=?, failure=? WHERE run=? AND job=? AND attempt=?", row)
        if then is None:
            self._submit(op, fence=job)
        else:
            self._track(op, fence=job).when_done(lambda _error: then())

    def adopt_reservation(self, job: str, attempt: int) -> None:
        """A resumed attempt's reservation is this controller's now (its release closes it)."""
        row = (self.owner, self.run_of(job), job, attempt)
        self._submit(("UPDATE reservations SET owner=? WHERE run=? AND job=? AND attempt=? AND state='live'", row),
                     wait=True, fence=job)

    def record_swept_charge(self, *, job: str, attempt: int, usd: float, seconds: float,
                            run: str | None = None) -> None:
        """A dead controller's machine is gone: its live reservation is replaced by what the machine
        cost (reservations.py's reckoning: price x from its creation to its deletion)."""
        row = (usd, seconds, time.time(), job, attempt, run, run)
        self._submit((
            "UPDATE reservations SET state='released', charged=?, seconds=?, outcome='failed', failure='canceled',"
            " released_at=? WHERE job=? AND attempt=? AND state='live' AND (CAST(? AS TEXT) IS NULL OR run=?)", row))
