"""JobSupervisor: one per job. Runs attempts until one succeeds or the policy says stop.

Supervision, as supervisor.erl would write it down:
- one child at a time, the AttemptActor, restart type `transient`: restarted (as a new attempt
  on a fresh machine) only after an abnormal end, and only as `policy.decide` allows;
- restart intensity: more than `policy.thrash_max` failed attempts within `thrash_window_s`
  stops the job with `thrashing`; besides, at most `max_attempts` counted attempts;
- a failure counts against `max_attempts`, or, when its kind has a budget of its own
  (`max_preemptions`, `max_stalls`, ...: policy.py `KINDS`), against that budget alone;
- after `oom` (`on_oom = "bigger"`), every later attempt runs only on offers with more GPU memory
  than the one that ran out (policy.py `bigger_than`); with no candidate that could be bigger the
  job ends `oom`;
- between retries, exponential backoff with jitter; a walk past a place with no stock is at once
  and never costs an attempt. `Retrying` is said as the retried attempt starts (never for one
  that does not run); a retry whose walk has passed over every place walks them all again;
- the capacity walk (walk.py) chooses each attempt's place; the attempt's time budget (its setup
  grace, the longest it holds the machine, the machine's deadline) is protocols/attempt_time.py's;
- no candidate with stock: the job waits for some (`WaitingForCapacity`), up to `capacity_wait_s`
  (waits.py: its default by cloud, the backoff of its asks), and asks at once when a job of its
  batch lets a machine go (the shared OfferBook wakes it); 0 fails at once;
- before each lease, money is reserved (job_money.py): against the seed's `max_usd`, the batch's
  budget and, when the policy names one, the team budget (team_hold.py, off this thread); an offer
  they cannot hold is passed over, and a walk that found stock only where money was short ends
  the job `budget` without renting anything, unless the team budget was short of room its live
  reservations will give back and `on_budget_full = "wait"` (the default): then the job waits
  for room as for stock (`WaitingForCapacity` naming the budget, the same clock), asking at once
  when the ledger committed a release of its batch's (`team_waits`), and ends `budget` saying it
  waited when `capacity_wait_s` ran out;
- stop: `Cancel` is forwarded to the running attempt (which deletes its machine); the job ends
  `canceled` (or `budget`) when that attempt has ended; `on_stop` stops a child still running.

It tells its parent `JobEnded` exactly once, and writes the seed's `response.json`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import outcome
import pykka

from actor_run.actors import Actor, AttemptActor, Context, Reattach, Result
from actor_run.actors.flag import Flag
from actor_run.protocols.attempt_time import AttemptTime, attempt_time
from actor_run.protocols.failures import Code, LaunchError, Refused, SpecError
from actor_run.protocols.files import write_private
from actor_run.protocols.hosts.workspace import RESUME_LINE
from actor_run.protocols.messages import (
    AttemptEnded,
    Cancel,
    ChildFailed,
    JobEnded,
    JobHead,
    Message,
    Offer,
    Retrying,
    WaitingForCapacity,
    ended_outcome,
)
from actor_run.protocols.specs import Job
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.ledger.team import Held
from actor_run.supervisors.tree import team_hold
from actor_run.supervisors.tree.budget import Budget, BudgetChange, reservation_usd
from actor_run.supervisors.tree.job_money import JobMoney
from actor_run.supervisors.tree.offers import OfferBook
from actor_run.supervisors.tree.policy import (
    UNCOUNTED,
    Action,
    Count,
    backoff_s,
    bigger_than,
    counted_attempts,
    counts,
    decide_after,
    may_be_bigger,
)
from actor_run.supervisors.tree.seed_end import attempt_record, response_json, tidy_seed_dir
from actor_run.supervisors.tree.waits import JobWait, Shortfalls, Wakeups, capacity_wait, wanted
from actor_run.supervisors.tree.walk import Accounts, Exhausted, NeedOffers, Walk


class _Offers(Message, frozen=True, kw_only=True):
    candidate: int
    result: Any


class _Launch(Message, frozen=True, kw_only=True):
    wait: int = -1  # >= 0: the wake-up of that wait for capacity (only the first of its wake-ups counts)


def job_label(name: str, seed: int) -> str:
    """A JobSupervisor's label (of the job `name`'s seed): what its log lines and its `ChildFailed` name it by."""
    return f"job:{name}/{seed}"


class JobLeft(Message, frozen=True, kw_only=True):
    """Told to the batch by a JobSupervisor stopped before it ended (let go to another controller,
    BatchSupervisor's `Abandon`), once its stop hook has run: its attempt stopped, its machine let go."""

    key: str


class JobSupervisor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: Job, ledger: Ledger,
                 first_attempt: int = 0, rng_seed: int | None = None, reattach: Reattach | None = None,
                 reattach_offer: Offer | None = None, offers: OfferBook | None = None,
                 seed_dir: Path, budget: Budget | None = None,
                 spent_before_usd: float = 0.0, team_waits: Wakeups | None = None) -> None:
        super().__init__(ctx, parent, job_label(job.name, job.seed))
        self.ledger = ledger
        self.offers = offers if offers is not None else OfferBook(ctx.reactor, ctx.clouds)  # shared by a batch
        self.first_attempt = first_attempt
        self.reattach = reattach
        self.reattach_offer = reattach_offer
        self.job = job
        self.head: JobHead = {"job": job.name, "seed": job.seed}
        # where the run said at its start (a resume passes the folder the ledger recorded)
        self.seed_dir = seed_dir  # tree/seed_end.py seed_dir: the run recorded it
        self.response_path = os.path.join(self.seed_dir, "response.json")  # a string: made once, not at the end
        self.fits: Callable[[Offer], bool] | None = None  # after an out-of-memory end: more GPU memory only
        self.walk = Walk(len(job.candidates))
        self.money = JobMoney(ctx, ledger, self.head, job.key, budget=budget, max_usd=job.max_usd,
                              spent_before_usd=spent_before_usd)
        self.accounts = Accounts([c.accounts for c in job.candidates])  # which one each candidate is on
        self.short = Shortfalls()  # why this walk found no place it could take (waits.py)
        self.team_hold: tuple[Offer, BudgetChange, float] | None = None  # a hold the team budget has not answered
        self.team_waits = team_waits if team_waits is not None else Wakeups()  # woken by the batch's releases
        self.attempt_no = first_attempt
        self.counted = 0
        self.failure_times: list[float] = []
        self.history: list[dict[str, Any]] = []
        self.child: pykka.ActorRef[Any] | None = None
        self.offer: Offer | None = None
        self.cancel: Cancel | None = None
        self.ended = False
        self.usd_done = 0.0
        self.rng_seed = rng_seed
        self._rng: random.Random | None = None  # made at the first backoff: seeding one costs a read of urandom
        self.fresh = False  # this job made its seed folder: nothing an earlier run fetched is in it
        # set by an attempt that asks for a checkpoint into the seed's .checkpoint: in a fresh folder,
        # the job's end looks for one only then (actors/attempt.py)
        self.checkpoint_asked = Flag()
        self.started = time.time()
        if reattach is not None:  # an adopted job began with its machine, not with the adoption
            self.started = min(self.started, reattach.machine.created_at or self.started)
        self.retry: tuple[Code, float] | None = None  # the failure a retry follows and its backoff
        self.retry_counts: dict[str, Count] = {}  # each retry budget's count after that failure (for Retrying)
        self.rewalk = False  # a retry may walk every place again (its walk passed over them, not found them empty)
        self.wait = JobWait()  # for stock or team budget room (waits.py); its wake-ups carry its `gen`

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.rng_seed)
        return self._rng

    def on_start(self) -> None:
        self.ctx.at("out_folder", self.job.key)
        try:
            self.seed_dir.mkdir(parents=True)
        except FileExistsError:
            pass  # a run before this one may have left outputs here: `fresh` stays False
        else:
            self.fresh = True
        if self.reattach is not None:
            offer = self.reattach_offer or Offer(cloud=self.reattach.machine.cloud, region=self.reattach.machine.region,
                                                 gpu=self.reattach.machine.gpu,
                                                 hourly_usd=self.reattach.machine.hourly_usd)
            self.offer = offer
            self.walk.set_offers(offer.candidate, [offer])
            self.walk.index = offer.candidate
            reserved = self.money.adopt(self.attempt_no, reservation_usd(
                offer.hourly_usd, max(0.0, self.reattach.machine.deadline - time.time())))
            self.child = AttemptActor.start(self.ctx, self.actor_ref, job=self.job, attempt=self.attempt_no,
                                            offer=offer, timebox=self._timebox(offer), seed_dir=self.seed_dir,
                                            reattach=self.reattach, reserved_usd=reserved,
                                            checkpoint_asked=self.checkpoint_asked)
            self.reattach = None
            return
        self._next()

    # --- choosing a place ----------------------------------------------------------------------

    def _next(self) -> None:
        if self.cancel is not None:
            self._end("failed", self.cancel.failure, self.cancel.detail or "canceled")
            return
        if self.ctx.stopping.is_set():
            # the whole run is being cancelled and this job's Cancel has not come yet (a hundred
            # thousand jobs' mailboxes): no attempt starts, no machine is asked for
            self._end("failed", *self.ctx.stop_reason)
            return
        step = self.walk.next()
        match step:
            case NeedOffers(candidate=i):
                ref = self.actor_ref

                def reply(result: Result[list[Offer]], i: int = i) -> None:  # on the reactor thread
                    with contextlib.suppress(pykka.ActorDeadError):  # ended meanwhile (cancelled)
                        ref.tell(_Offers(candidate=i, result=result))

                try:
                    self.offers.ask(self.job.candidates[i], i, reply, account=self.accounts.of(i))
                except KeyError:  # a cloud this controller could not build (a worker without its key)
                    cloud = self.job.candidates[i].cloud
                    self._offers(i, outcome.Error(SpecError(
                        f"candidates[{i}].cloud", f"{cloud!r} cannot be used by this controller (its key or its "
                        "settings are missing here)")))
            case Exhausted():
                if self.short.money and self.short.team is not None:  # room may come back: wait for it
                    self._wait_for_capacity(budget=self.short.team)
                elif self.short.money:
                    self._end("failed", Code.BUDGET, "no offer fits what is left of the budget: "
                              + self.short.money_text())
                elif self.rewalk:  # a retry: the places were passed over after failures, not found empty
                    self.rewalk = False
                    self.walk = Walk(len(self.job.candidates), self.fits)
                    self._next()
                else:
                    self._wait_for_capacity()
            case Offer() as offer:
                reserved = self._reserve(offer)
                if reserved is None:  # the budget cannot hold it: the next place, at once
                    self.walk.pass_over(offer)
                    self._next()
                    return
                if self.team_hold is not None:  # the team budget's answer comes as _TeamHeld
                    return
                self._start_on(offer, reserved)

    def _start_on(self, offer: Offer, reserved: float) -> None:
        self.offer = offer
        if self.retry is not None:  # said now that the attempt runs
            code, delay = self.retry
            self.retry = None
            self.ctx.emit(Retrying(**self.head, attempt=self.attempt_no, failure=code,
                                   delay_s=round(delay, 3), offer=offer, counts=self.retry_counts))
        self._launch(offer, reserved)

    def _wait_for_capacity(self, budget: str = "") -> None:
        """No candidate place has stock (or, `budget`, room in that team budget): wait for some (see
        the module docstring), or end."""
        limit = capacity_wait(self.job)
        fresh, left = self.wait.step(budget, limit)
        if fresh and limit > 0:
            self.ctx.emit(WaitingForCapacity(**self.head, attempt=self.attempt_no, wanted=wanted(self.job),
                                             until=round(time.time() + max(0.0, left), 3), budget=budget))
        if left <= 0:
            last = self.history[-1] if self.history else None
            waited = f" (waited {limit:.0f} s)" if limit > 0 else ""
            if budget:
                self._end("failed", Code.BUDGET, f"no room in the team budget {budget!r}{waited}: "
                          + self.short.money_text())
            elif last and last.get("failure") not in (None, Code.NO_CAPACITY):
                self._end("failed", Code(last["failure"]), last.get("detail", ""))
            else:  # a catalog that did not answer was taken as no stock: said, or the detail misleads
                self._end("failed", Code.NO_CAPACITY,
                          f"no candidate place has stock{waited}: {wanted(self.job)}{self.short.unread_text()}")
            return
        self.walk = Walk(len(self.job.candidates), self.fits)  # stock (or money) may come back: walk again soon
        self.short.new_walk()
        self.wait.gen += 1
        gen, ref = self.wait.gen, self.actor_ref

        def freed() -> None:  # on the thread of the job that let a machine go (or of the ledger's writer)
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Launch(wait=gen))

        if budget:
            self.team_waits.when(self.job.key, freed)
        else:
            self.offers.when_freed(self.job.key, freed)
        self.later(self.wait.next_pause(left), _Launch(wait=gen))

    def _offers(self, candidate: int, result: Result[list[Offer]]) -> None:
        if isinstance(result, outcome.Error):
            error = result.error
            if isinstance(error, LaunchError | Refused) and error.code is Code.GUARD:  # the key was refused
                self._end("failed", Code.GUARD, str(error))
                return
            # taken as no stock there this time (the walk asks again): the run's log, not a warning; a
            # job that finds no place in the end says so when it ends. A candidate the settings cannot
            # serve (a host they do not have) is the user's to mend: a warning
            if isinstance(error, SpecError):
                self.log.warning("offers for candidate {} failed: {}", candidate, error)
            else:
                self.log.info("offers for candidate {} failed: {}", candidate, error)
            self.short.unread[candidate] = str(error)[:300]
            self.walk.set_offers(candidate, [])
        else:
            self.short.unread.pop(candidate, None)
            self.walk.set_offers(candidate, result.value)
        self._next()

    def _timebox(self, offer: Offer) -> AttemptTime:
        """The time budget of an attempt on `offer` (the last candidate's grace is the longest)."""
        return attempt_time(self.job.policy, self.job.timeout_s, last=self.walk.is_last(offer))

    def _reserve(self, offer: Offer) -> float | None:
        """Set money aside for an attempt on `offer` (job_money.py), and ask the team budget to hold
        it too (its answer: `TeamHeld`). None (nothing held) if the seed's or the batch's cannot."""
        self.ctx.at("budget", self.job.key)
        hold_s = self._timebox(offer).hold_s
        where = f"{offer.cloud}{'/' + offer.account if offer.account else ''} {offer.region} {offer.gpu}".strip()
        change = self.money.reserve(self.attempt_no, reservation_usd(offer.hourly_usd, hold_s), where)
        if isinstance(change, str):
            self.short.money.append(change)
            return None
        if self.job.policy.budget or self._batch_in_ledger():  # in a transaction of the ledger's own
            self._hold_team(offer, change, hold_s)
        else:
            self.money.record(self.attempt_no, offer, change, hold_s)
        return change.usd

    def _batch_in_ledger(self) -> bool:
        """The batch's `budget_usd` is kept by the ledger: on a shared one many workers run its jobs,
        each with a Runner that knows only its own (none, for a worker's)."""
        return self.job.policy.budget_usd is not None and self.ledger.backend.fenced

    def _hold_team(self, offer: Offer, change: BudgetChange, hold_s: float) -> None:
        """Ask the ledger to hold the reservation against the team budget and, on a shared ledger,
        the batch's (team_hold.py); the answer comes back as `TeamHeld`."""
        row = self.ledger.reservation_row(job=self.job.key, attempt=self.attempt_no, offer=offer, hold_s=hold_s,
                                          usd=change.usd, seq=change.seq, limit_usd=change.limit_usd)
        self.team_hold = (offer, change, hold_s)
        team_hold.ask(self.ctx, self.actor_ref, self.ledger, budget=self.job.policy.budget, row=row, seq=change.seq,
                      budgets=self.money.budgets,
                      batch_usd=self.job.policy.budget_usd if self._batch_in_ledger() else None)

    def _team_held(self, result: Result[Held]) -> None:
        if self.team_hold is None:
            return
        offer, change, hold_s = self.team_hold
        self.team_hold = None
        name = self.job.policy.budget
        ok = isinstance(result, outcome.Value) and result.value.ok
        if ok and not self.ended and self.cancel is None:
            self.money.record(self.attempt_no, offer, change, hold_s, team=name)
            self._start_on(offer, change.usd)
            return
        team_hold.let_go(self.ledger, self.job.key, self.attempt_no, change.seq, self.money.budgets, held=ok)
        if self.ended or self.cancel is not None:  # it ran nothing, and nothing more comes of it
            return
        refused = team_hold.refusal(name, f"{offer.cloud} {offer.region} {offer.gpu}".strip(), change.usd, result)
        self.short.money.append(refused.line)
        if refused.waitable and name and self.job.policy.on_budget_full == "wait":
            self.short.team = name
        self.walk.pass_over(offer)
        self._next()

    def _launch(self, offer: Offer, reserved_usd: float | None = None) -> None:
        if reserved_usd and self.money.capped():  # issue 45: a provider's own spend limit at what the attempt holds
            offer = msgspec.structs.replace(offer, spend_cap_usd=round(reserved_usd, 2))
        checkpoint = self.seed_dir / ".checkpoint"
        resume = checkpoint if self.attempt_no > 0 and (checkpoint / RESUME_LINE).is_file() else None
        # nothing to replace at the fetch: a folder this job made, that no attempt of it ran in (and so fetched into)
        clean = self.fresh and not any("run" in h["phases"] for h in self.history)
        self.child = AttemptActor.start(self.ctx, self.actor_ref, job=self.job, attempt=self.attempt_no, offer=offer,
                                        timebox=self._timebox(offer), seed_dir=self.seed_dir, resume_dir=resume,
                                        seed_dir_clean=clean, reserved_usd=reserved_usd,
                                        checkpoint_asked=self.checkpoint_asked)

    # --- messages ------------------------------------------------------------------------------

    def handle(self, message: Any) -> Any:
        if self.ended:  # JobEnded is told (a message its own stop did not answer)
            if isinstance(message, team_hold.TeamHeld):
                self._team_held(message.result)  # a hold made after the end is let go
            return None
        if self.ctx.fault is not None:
            self.ctx.at(f"event:{type(message).__name__}", self.job.key)
        match message:
            case _Offers(candidate=i, result=result):
                self._offers(i, result)
            case team_hold.TeamHeld(result=result):
                self._team_held(result)
            case _Launch(wait=wait):
                if wait >= 0:  # a wake-up of a wait for capacity: the first one counts
                    if wait != self.wait.gen or self.child is not None:
                        return None
                    self.wait.gen += 1
                self._next()
            case AttemptEnded() as ended:
                self._attempt_ended(ended)
            case Cancel() as c:
                self._cancel(c)
            case ChildFailed(child=child, detail=detail):
                # an attempt that failed ends itself with AttemptEnded(internal); nothing more here
                self.log.error("{} failed: {}", child, detail)
            case _:
                raise TypeError(f"JobSupervisor cannot handle {message!r}")
        return None

    def _cancel(self, c: Cancel) -> None:
        if self.ended or self.cancel is not None:
            return
        self.cancel = c
        if self.child is not None and self.child.is_alive():
            self.child.tell(c)
        else:
            self.cancel_tasks()  # a backoff timer (an offers answer still out finds the job ended)
            self._end("failed", c.failure, c.detail or "canceled")

    def _attempt_ended(self, e: AttemptEnded) -> None:
        self.ctx.emit(e)
        self.child = None
        # a team budget's release: once committed, the batch's jobs waiting for room in one look again
        self.money.charge(e, then=self.team_waits.wake if self.job.policy.budget else None)
        self.usd_done += e.usage.usd
        self.history.append(attempt_record(e))
        self.ledger.record_attempt(
            job=self.job.key, attempt=e.attempt, machine="", cloud=self.history[-1]["cloud"],
            region=self.history[-1]["region"], state=e.outcome, failure=e.failure, detail=e.detail,
            started=e.t - sum(e.phases.values()), ended=e.t, usd=e.usage.usd,
        )
        self.attempt_no += 1
        if e.outcome == "succeeded":
            self.offers.freed()
            self._end("succeeded", None, "")
            return
        code = e.failure or Code.INTERNAL
        if self.cancel is not None:
            self._end("failed", self.cancel.failure, self.cancel.detail or e.detail)
            return
        if code is Code.QUOTA and self.offer is not None and self.accounts.next(self.walk, self.offer):
            self._next()  # no machine was made: at once, not counted
            return
        if code not in (Code.NO_CAPACITY, Code.QUOTA):
            self.counted += code not in UNCOUNTED
            self.wait.found()  # it found a place: a wait for capacity after this is a new one
            self.offers.freed()  # it held a machine, now let go: jobs waiting for capacity ask again
        decision, self.failure_times = decide_after(code, [h["failure"] for h in self.history],
                                                    failure_times=self.failure_times, now=time.monotonic(),
                                                    policy=self.job.policy)
        if decision.action is Action.STOP:
            assert decision.code is not None
            detail = f"{decision.detail}; last: {e.detail}" if decision.detail else e.detail
            self._end("failed", decision.code, detail)
            return
        assert self.offer is not None
        if decision.walk:
            self.walk.pass_over(self.offer)
        if decision.bigger and not self._only_bigger(self.offer, e.detail):
            return
        if decision.action is Action.WALK:
            self._next()
            return
        delay = backoff_s(self.counted, base_s=self.job.policy.backoff_s, max_s=self.job.policy.backoff_max_s,
                          rng=self.rng)
        self.retry, self.rewalk = (code, delay), True  # Retrying is said when the attempt starts
        self.retry_counts = counts([h["failure"] for h in self.history], self.job.policy)
        self.later(delay, _Launch())

    def _only_bigger(self, offer: Offer, detail: str) -> bool:
        """After `oom` on `offer`: walk on only to offers with more GPU memory (True), or end the job
        `oom` when the GPU table does not know `offer`'s memory or no candidate could be bigger."""
        fits = bigger_than(offer.gpu)
        if fits is None or not may_be_bigger(self.job.candidates, offer.gpu):
            why = (f"the GPU table does not know how much memory {offer.gpu or 'this machine'} has"
                   if fits is None else f"no candidate has more GPU memory than {offer.gpu}")
            self._end("failed", Code.OOM, f"{why}; last: {detail}")
            return False
        self.fits = self.walk.fits = fits
        return True

    # --- the end -------------------------------------------------------------------------------

    def _end(self, outcome_: str, failure: Code | None, detail: str) -> None:
        if self.ended:
            return
        self.ended = True
        self.cancel_tasks()
        self.team_waits.forget(self.job.key)
        self.offers.forget(self.job.key)
        # a folder this job made holds a checkpoint only if one of its attempts asked for one
        out_dir = tidy_seed_dir(self.seed_dir, self.history,
                                checkpoint=not self.fresh or self.checkpoint_asked.is_set())
        outcome_ = ended_outcome(failure) if outcome_ == "failed" else outcome_
        tally = self._write_response(outcome_, failure, detail)
        event = JobEnded(**self.head, attempt=max(0, self.attempt_no - 1), outcome=outcome_, failure=failure,
                         detail=detail, attempts=counted_attempts(self.history), usd=round(self.usd_done, 6),
                         out_dir=str(out_dir), counts=tally)
        self.ctx.emit(event)
        self.tell_parent(event)
        self.stop_now()  # told and written: what is left of this actor is bookkeeping

    def _write_response(self, outcome_: str, failure: Code | None, detail: str) -> dict[str, Count]:
        """response.json, through the ledger's fence; returns each retry budget's count (JobEnded says them)."""
        self.ctx.at("response", self.job.key)
        tally = counts([h["failure"] for h in self.history], self.job.policy)
        data = response_json(self.job, outcome_, failure, detail, self.history, self.usd_done, self.started,
                             {k: msgspec.structs.asdict(v) for k, v in tally.items()})
        # through the ledger's fence: a controller that lost the job writes no response.json
        self.ledger.write_file(self.job.key, functools.partial(write_private, self.response_path, data))
        return tally

    def on_failure(self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        """Actor thread, after a raise in `on_start` or a handler (a bug): the attempt still running
        is stopped first (its lease deletes the machine), what it had set aside counts as spent (its
        cost is unknown now), then the parent hears `ChildFailed` and ends the job `internal`."""
        try:
            self.on_stop()
            self.money.forfeit(self.attempt_no)
        finally:
            super().on_failure(exception_type, exception_value, traceback)

    def on_stop(self) -> None:
        """Actor thread, after stop(): an attempt still running is stopped (its lease deletes the machine,
        or lets it go to the controller that took the job over). A job stopped before it ended tells
        its batch `JobLeft` then (the batch forgets it)."""
        self.cancel_tasks()
        if self.child is not None and self.child.is_alive():
            try:
                self.child.stop(block=True, timeout=self.ctx.delete_timeout_s + 90)
            except pykka.Timeout:
                self.log.error("attempt did not stop in time")
        if not self.ended:
            self.tell_parent(JobLeft(key=self.job.key))
