"""What the ledger records of owners (the controllers, each alive by its lease or its process: owners.py
reads them) and machines (the LedgerPort a lease uses: intent, launch, run, gone), and of the clouds
they are on."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

import msgspec

from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger.core import LedgerCore
from actor_run.supervisors.ledger.db import Conn
from actor_run.supervisors.ledger.owners import process_start_time
from actor_run.supervisors.ledger.queue import StaleClaim, Waiter


class MachineRecords(LedgerCore):
    """The ledger's writes about owners, machines and clouds (a part of `Ledger`)."""

    def register_owner(self) -> None:
        """This controller is alive; on a fenced backend, with a lease of `lease_s` from now (by the
        database's clock) that `beat_owner` renews."""
        pid = os.getpid()
        started = process_start_time(pid) or time.time()
        host, now, owner = socket.gethostname(), time.time(), self.owner
        lease = self.lease_s
        self._submit((
            f"INSERT OR REPLACE INTO owners (id, pid, started, host, beat, closed, lease_until)"
            f" VALUES (?,?,?,?,?,0,{self.backend.now_sql} + ?)",
            (owner, pid, started, host, now, lease)), wait=True)

    def beat_owner(self) -> bool:
        """Renew the lease (queued; the Waiter-free write commits with the next batch). Returns False
        once this owner's lease is known to have expired: it is dead for everyone then."""
        now, owner, lease = time.time(), self.owner, self.lease_s
        if self.lease_lost:
            return False
        # an expired lease is never renewed: another controller may have taken its jobs already
        self._submit((f"UPDATE owners SET beat=?, lease_until={self.backend.now_sql} + ?"
                      f" WHERE id=? AND closed=0 AND (lease_until IS NULL OR lease_until > {self.backend.now_sql})",
                      (now, lease, owner)))
        return True

    def close_owner(self) -> None:
        if self.lease_lost:
            return  # dead for everyone already, and it writes nothing more
        owner = self.owner
        with contextlib.suppress(StaleClaim):  # its lease ran out meanwhile (a starved process): as dead as closed
            self._submit(("UPDATE owners SET closed=1 WHERE id=?", (owner,)), wait=True)

    def record_intent(self, *, name: str, cloud: str, job: str, seed: int, attempt: int, deadline: float,
                      offer: Offer | None = None) -> None:
        """Durable before it returns."""
        self.queue_intent(name=name, cloud=cloud, job=job, seed=seed, attempt=attempt, deadline=deadline,
                          offer=offer).wait()

    def queue_intent(self, *, name: str, cloud: str, job: str, seed: int, attempt: int, deadline: float,
                     offer: Offer | None = None) -> Waiter:
        """The intent, queued: the Waiter says when it is durable (the create call waits for that)."""
        offer_json = msgspec.json.encode(offer).decode() if offer is not None else None
        key = job_key(job, seed)
        run = self.run_of(key)
        row = (name, cloud, self.owner, run, job, seed, attempt, deadline, "alive", "requested", time.time(),
               offer_json)
        if key in self.tokens:
            self._machine_jobs[name] = key
        return self._track((
            "INSERT OR REPLACE INTO machines (name, cloud, owner, run, job, seed, attempt, deadline, state, phase,"
            " created, offer) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", row), key)

    def record_launched(self, machine: Machine) -> None:
        """The machine answers. An adopted one (a resume, a worker's adoption) answers again while
        its job runs: its row stays `running` (with its work folder and pid), so that if this
        controller dies too, the next one reattaches to the job instead of running it again."""
        row = (machine.id, machine.region, machine.hourly_usd, msgspec.json.encode(machine).decode(), machine.name)
        self._submit((
            "UPDATE machines SET phase=CASE WHEN phase='running' THEN phase ELSE 'launched' END, machine_id=?,"
            " region=?, hourly_usd=?, machine=? WHERE name=?", row),
            fence=self._machine_fence(machine.name))

    def adopt_machine(self, name: str, key: str | None = None, *, wait: bool = True) -> None:
        """This controller owns the machine now, and a sweep must leave it (resumable) until it is done
        (durable before it returns, unless not `wait`: then `flush` before a sweep)."""
        if key is not None and key in self.tokens:
            self._machine_jobs[name] = key
        row = (self.owner, name)
        self._submit(("UPDATE machines SET owner=?, resumable=1 WHERE name=? AND state='alive'",
                      row), wait=wait, fence=self._machine_fence(name))

    def record_started(self, name: str, work: str, pid: int, launched_at: float) -> None:
        row = (work, pid, launched_at, name)
        self._submit((
            "UPDATE machines SET phase='running', work=?, pid=?, launched_at=? WHERE name=?", row),
            fence=self._machine_fence(name))

    def record_taken(self, name: str, at: float) -> None:
        """The provider took the machine away (a preemption) at `at`: its bill stopped then. Kept in
        the machine's record (its `taken_at`), queued before the deletion is (the queue is FIFO), so
        a controller that dies between the deletion and the charge leaves what the settle of its
        reservation needs (reservations.py)."""

        def op(c: Conn) -> None:
            row = c.execute("SELECT machine FROM machines WHERE name=?", (name,)).fetchone()
            if row is None or row[0] is None:
                return  # never made: nothing billed
            m = msgspec.json.decode(row[0], type=Machine)
            c.execute("UPDATE machines SET machine=? WHERE name=?",
                      (msgspec.json.encode(msgspec.structs.replace(m, taken_at=at)).decode(), name))

        self._submit(op, fence=self._machine_fence(name))

    def queue_handle(self, name: str, work: str, handle: str, launched_at: float) -> Waiter:
        """A run the provider names by a handle (a queue job), queued: the Waiter says when it is
        durable (the submit does not return before). The row is `running` from then on."""
        row = (work, launched_at, handle, name)
        return self._track((
            "UPDATE machines SET phase='running', work=?, pid=0, launched_at=?, handle=? WHERE name=?", row),
            self._machine_fence(name))

    def record_gone(self, name: str, at: float, reason: str) -> None:
        """Durable before it returns."""
        self.queue_gone(name, at, reason).wait()

    def queue_gone(self, name: str, at: float, reason: str) -> Waiter:
        """The machine is gone, queued: the Waiter says when that is durable."""
        row = (at, reason, name)
        return self._track((
            "UPDATE machines SET state='deleted', phase='deleted', gone=?, reason=?, detail=NULL, resumable=0"
            " WHERE name=?", row), self._machine_fence(name))

    def record_delete_failed(self, name: str, detail: str) -> None:
        row = (detail[:500], name)
        self._submit((
            "UPDATE machines SET phase='delete_failed', detail=? WHERE name=? AND state='alive'", row), wait=True,
            fence=self._machine_fence(name))

    def still_holds(self, name: str) -> bool:
        """False once the job of the machine `name` is known to be another controller's (or this
        owner's lease expired): its machine is then the adopter's to keep or delete, not this
        controller's. What this process knows now; `check_hold` asks the database."""
        key = self._machine_jobs.get(name)
        return key is None or (key not in self.stale and not self.lease_lost)

    def check_hold(self, name: str) -> Waiter | None:
        """On a fenced backend, a no-op write fenced by the machine's job: once it is done (made, or
        refused as stale), `still_holds` says what the database said. None when there is nothing
        to ask: an SQLite ledger, a machine of no claimed job, a job already known lost."""
        key = self._machine_jobs.get(name)
        if not self.backend.fenced or key is None or key in self.stale or self.lease_lost or self._closed:
            return None
        return self._track(lambda c: None, key)

    def record_cloud(self, name: str, settings: dict[str, Any]) -> None:
        """A cloud this ledger's machines may be on, with its settings (never secrets), for sweeps."""
        row = (name, msgspec.json.encode(settings).decode())
        self._submit(("INSERT OR IGNORE INTO clouds (name, settings) VALUES (?,?)", row), wait=True)
