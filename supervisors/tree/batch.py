"""BatchSupervisor: the top of one Runner's tree. It starts the submitted jobs' JobSupervisors, at
most `concurrency` at once, under one cost ceiling (budget.py), and stops them in reverse start
order. The embedding API (supervisors/api) is its only client: the messages below are what it tells.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka

from actor_run.actors import Context, Reattach
from actor_run.actors.pool import PooledActor
from actor_run.protocols.failures import Code
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Cancel, ChildFailed, JobEnded, Message, Offer, ended_outcome
from actor_run.protocols.specs import (
    Job,
    job_key,
)
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.tree.budget import Budget
from actor_run.supervisors.tree.job import JobLeft, JobSupervisor, job_label
from actor_run.supervisors.tree.offers import OfferBook
from actor_run.supervisors.tree.waits import Wakeups

BURST_FIRST, BURST_MOST = 16, 1024  # the batch's turn: its first, and its largest (BatchSupervisor.burst)


class Submit(Message, frozen=True, kw_only=True):
    job: Job
    first_attempt: int = 0
    reattach: Reattach | None = None
    offer: Offer | None = None
    spent_before_usd: float = 0.0  # what the seed's attempts cost before a resume
    seed_dir: str  # the seed's folder its run recorded (seed_end.seed_dir)
    refuse: Cancel | None = None  # end it before anything is rented (a claimed job this process cannot run)


class Spent(Message, frozen=True, kw_only=True):
    """A running job's live cost, when it crossed a tenth of the budget since the last report."""

    key: str
    usd: float


class Abandon(Message, frozen=True, kw_only=True):
    """Another controller holds these jobs now (the ledger's fencing): stop them without touching
    their machines or writing anything more about them."""

    keys: frozenset[str]


class CancelJob(Message, frozen=True, kw_only=True):
    key: str
    failure: Code = Code.CANCELED
    detail: str = ""


class BatchSupervisor(PooledActor):
    """Runs submitted jobs, at most `concurrency` at once, under one cost ceiling. An adopted job
    whose machine runs it already (a reattach) starts at once whatever the count: watching is not a
    slot, and an orphan left unwatched is killed by its host's watchdog and paid for twice.

    Children: JobSupervisors, restart type `temporary` (a job's retries are its own supervisor's
    business), started in submission order as slots free up, stopped in reverse start order.
    Budget: each job reserves money before each lease (`budget`, shared by the jobs: budget.py),
    so reservations and spend together never pass the ceiling. As a backstop, finished jobs' cost
    plus running attempts' live cost is watched too: at the ceiling every running job is cancelled
    with `budget` and every pending one ends `budget` without starting."""

    # the batch's messages start and end jobs: a few actors made or a count moved each. At the pool's
    # 32 a turn it started 32 jobs per round of the whole queue, and once the first machines answered
    # (2 s in bench/load.py) each round held thousands of their steps: 10,000 jobs submitted at once
    # were all asking for a machine at 5-6 s in some runs, at 15-18 s in others; 4-5 s at 1,024 a
    # turn. Not more: the first jobs' steps wait for the batch's whole turn (4,096 a turn: the first
    # lease asked for at 1.6-2 s instead of 0.1-0.4 s; 1,024: 0.9 s). So a turn starts at most as many
    # jobs as run already (`_start`): 16, 16, 32, 64 ... 1,024, the first jobs' steps between them.
    # bench/RESULTS.md, items 71 and 74
    burst = BURST_FIRST

    def __init__(self, ctx: Context, ledger: Ledger, *, concurrency: int, budget_usd: float | None,
                 on_end: Callable[[JobEnded], None], budget: Budget | None = None) -> None:
        super().__init__()
        self.ctx, self.ledger = ctx, ledger
        self.budget = budget if budget is not None else Budget(budget_usd)
        self.concurrency, self.budget_usd = concurrency, budget_usd
        self.on_end = on_end
        self.pending: collections.deque[Submit] = collections.deque()  # FIFO: a start pops the left end
        # the running jobs, in start order (a dict keeps it: `on_stop` stops them in reverse). Every
        # per-job table here forgets a job once its end is handled: a worker's batch runs for days
        self.running: dict[str, pykka.ActorRef[Any]] = {}
        # the jobs let go (another controller holds them now), each stopping: their leases announce
        # `Released` as they leave the machine; `on_stop` waits for those stops too. A job's `JobLeft`
        # (its stop hook ran) takes it out
        self.leaving: dict[str, pykka.Future[Any]] = {}
        self.live_usd: dict[str, float] = {}
        self.done_usd = 0.0
        self.stopped: Cancel | None = None
        self.labels: dict[str, str] = {}  # a JobSupervisor's label (as its ChildFailed names it) -> job key
        self.offers = OfferBook(ctx.reactor, ctx.clouds)  # jobs starting together ask each cloud once
        self.team_waits = Wakeups()  # jobs waiting for room in a team budget, woken by their batch's releases

    def on_receive(self, message: Any) -> Any:
        if self.ctx.fault is not None:
            self.ctx.at(f"batch:{type(message).__name__}", getattr(message, "key", ""))
        match message:
            case Submit(job=job) as submit:
                why = submit.refuse or self.stopped or self._stopping()
                if submit.reattach is not None and submit.refuse is None:
                    # watching is not a slot: an adopted running job is watched at once; and a stop
                    # cannot end it unstarted, its machine being ours now: it is adopted, then cancelled
                    # (its lease deletes the machine)
                    self._start(submit)
                    if why is not None:
                        self.running[job.key].tell(why)
                elif why is not None:
                    self._end_unstarted(job, why)
                else:
                    self.pending.append(submit)
                    self._fill()
            case JobEnded() as e:
                key = job_key(e.job, e.seed)
                self.running.pop(key, None)
                self.labels.pop(job_label(e.job, e.seed), None)
                self.live_usd.pop(key, None)
                self.done_usd += e.usd
                self.on_end(e)
                self._fill()
            case Spent(key=key, usd=usd):
                if key in self.running:
                    self.live_usd[key] = usd
                    self._check_budget()
            case Abandon(keys=keys):
                self._abandon(keys)
            case JobLeft(key=key):
                self.leaving.pop(key, None)
            case CancelJob(key=key, failure=failure, detail=detail):
                self._cancel_one(key, Cancel(failure=failure, detail=detail))
            case Cancel() as c:
                self._cancel_all(c)
            case ChildFailed(child=child, detail=detail):
                self._job_crashed(child, detail)
            case "spent":
                return self.done_usd + sum(self.live_usd.values())
            case _:
                raise TypeError(f"BatchSupervisor cannot handle {message!r}")
        return None

    def _stopping(self) -> Cancel | None:
        """The Runner's whole cancel, before its Cancel reaches this batch's turn (a hundred thousand
        submits ahead of it): what a job not yet started ends with instead of starting."""
        if not self.ctx.stopping.is_set():
            return None
        failure, detail = self.ctx.stop_reason
        return Cancel(failure=failure, detail=detail)

    def _fill(self) -> None:
        while self.pending and len(self.running) < self.concurrency and self.stopped is None:
            why = self._stopping()
            if why is not None:
                while self.pending:
                    self._end_unstarted(self.pending.popleft().job, why)
                return
            self._start(self.pending.popleft())

    def _start(self, s: Submit) -> None:
        self.running[s.job.key] = JobSupervisor.start(self.ctx, self.actor_ref, job=s.job, ledger=self.ledger,
                                                      first_attempt=s.first_attempt, reattach=s.reattach,
                                                      reattach_offer=s.offer, offers=self.offers,
                                                      budget=self.budget, spent_before_usd=s.spent_before_usd,
                                                      team_waits=self.team_waits,
                                                      seed_dir=Path(s.seed_dir))
        self.labels[job_label(s.job.name, s.job.seed)] = s.job.key
        self.burst = min(BURST_MOST, max(BURST_FIRST, len(self.running)))  # the next turn's (class comment)

    def _job_crashed(self, label: str, detail: str) -> None:
        """A JobSupervisor raised (a bug): it stopped its attempt first (the lease deleted the
        machine; JobSupervisor.on_failure), so the job ends here `internal` and the batch goes on."""
        key = self.labels.get(label)
        if key is None or key not in self.running:
            return  # it had ended (JobEnded came first) or was let go
        self.running.pop(key)
        self.labels.pop(label, None)
        usd = self.live_usd.pop(key, 0.0)
        self.done_usd += usd
        name, _, seed = key.rpartition("/seed-")
        logger.error("{}: crashed ({}); ended `internal`, its machine deleted (traceback in the run's log)",
                     key, detail)
        e = JobEnded(job=name, seed=int(seed), outcome="failed", failure=Code.INTERNAL,
                     detail=f"internal error: {detail}", attempts=0, usd=round(usd, 6))
        self.ctx.emit(e)
        self.on_end(e)
        self._fill()

    def _end_unstarted(self, job: Job, c: Cancel) -> None:
        e = JobEnded(job=job.name, seed=job.seed, outcome=ended_outcome(c.failure), failure=c.failure,
                     detail=c.detail or "canceled before it started", attempts=0)
        self.ctx.emit(e)
        self.on_end(e)

    def _cancel_one(self, key: str, c: Cancel) -> None:
        for s in list(self.pending):
            if s.job.key == key:
                self.pending.remove(s)
                self._end_unstarted(s.job, c)
        ref = self.running.get(key)
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # it ended and stopped; its JobEnded is on its way here
                ref.tell(c)

    def _abandon(self, keys: frozenset[str]) -> None:
        """Each lease lets its machine go (LeaseActor._let_go): the adopter has it. The job ends
        here `canceled` for this controller's handles; the ledger refuses to record that end."""
        for s in list(self.pending):
            if s.job.key in keys:
                self.pending.remove(s)
                self._end_unstarted(s.job, Cancel(failure=Code.CANCELED, detail="taken over by another controller"))
        for key in keys:
            ref = self.running.pop(key, None)
            if ref is None:
                continue
            self.live_usd.pop(key, None)
            name, _, seed = key.rpartition("/seed-")
            self.labels.pop(job_label(name, int(seed)), None)
            with contextlib.suppress(pykka.ActorDeadError):
                self.leaving[key] = ref.stop(block=False)
            e = JobEnded(job=name, seed=int(seed), outcome="canceled", failure=Code.CANCELED,
                         detail="taken over by another controller (this controller's lease expired)")
            self.on_end(e)
        self._fill()

    def _cancel_all(self, c: Cancel) -> None:
        if self.stopped is None:
            self.stopped = c
        for s in self.pending:
            self._end_unstarted(s.job, c)
        self.pending.clear()
        for ref in self.running.values():
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(c)

    def _check_budget(self) -> None:
        if self.budget_usd is None or self.stopped is not None:
            return
        spent = self.done_usd + sum(self.live_usd.values())
        if spent >= self.budget_usd:
            detail = f"the batch spent ${spent:.2f} of its ${self.budget_usd:.2f} budget"
            self._cancel_all(Cancel(failure=Code.BUDGET, detail=detail))

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """Actor thread, after a raise here (a bug): logged (to the run's log), every running job is
        stopped in reverse start order (each deletes its machine) and every job not ended, running or
        pending, ends `internal`, so that the Runner's `wait`, `cancel` and `close` still return."""
        super().on_failure(exception_type, exception_value, traceback)
        failure = Cancel(failure=Code.INTERNAL, detail=f"the batch supervisor failed: {exception_value}")
        self.stopped = self.stopped or failure
        try:
            self.on_stop()
        finally:
            for s in self.pending:
                self._end_unstarted(s.job, failure)
            self.pending.clear()
            for key in list(self.running):
                self.running.pop(key)
                name, _, seed = key.rpartition("/seed-")
                e = JobEnded(job=name, seed=int(seed), outcome="failed", failure=Code.INTERNAL,
                             detail=failure.detail, attempts=0)
                self.ctx.emit(e)
                self.on_end(e)

    def on_stop(self) -> None:
        """Stop running jobs in reverse start order (each deletes its machine before it stops)."""
        for key in reversed(list(self.running)):
            ref = self.running.get(key)
            if ref is not None and ref.is_alive():
                try:
                    ref.stop(block=True, timeout=self.ctx.delete_timeout_s + 120)
                except pykka.Timeout:
                    logger.error("job {} did not stop in time", key)
        for stopping in list(self.leaving.values()):  # the jobs let go: none outlives the batch (a Runner closing next)
            try:
                stopping.get(timeout=self.ctx.delete_timeout_s + 120)
            except pykka.Timeout:
                logger.error("a job let go to another controller did not stop in time")
