"""What the ledger records of attempts and their events."""

from __future__ import annotations

from actor_run.protocols.messages import Event, encode
from actor_run.protocols.redact import redact
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger.core import LedgerCore


class AttemptRecords(LedgerCore):
    """The ledger's writes about attempts and events (a part of `Ledger`)."""

    def record_attempt(self, *, job: str, attempt: int, machine: str, cloud: str, region: str, state: str,
                       failure: str | None, detail: str, started: float, ended: float | None, usd: float) -> None:
        row = (self.run_of(job), job, attempt, self.owner, machine, cloud, region, state, failure,
               redact(detail)[:1000], started, ended, usd)
        self._submit((
            "INSERT OR REPLACE INTO attempts (run, job, attempt, owner, machine, cloud, region, state, failure,"
            " detail, started, ended, usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row), fence=job)

    def record_event(self, event: Event) -> None:
        key = job_key(event.job, event.seed)
        row = (event.t, self.run_of(key), self.owner, key, event.seed, event.attempt, type(event).__name__,
               redact(encode(event).decode()))  # no secret value this process knows
        self._submit((
            "INSERT INTO events (t, run, owner, job, seed, attempt, type, body) VALUES (?,?,?,?,?,?,?,?)", row),
            fence=key)
