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
- no candidate with stock: the job waits for capacity (`WaitingForCapacity`), `capacity_wait_s`
  long (default by cloud: `CAPACITY_WAIT_S`), asking again with backoff up to
  `CAPACITY_ASK_MAX_S` apart, and at once when a job of its batch lets a machine go (the shared
  OfferBook wakes it: one ask per candidate for all the jobs woken); 0 fails at once;
- the capacity walk (walk.py) chooses each attempt's place; the attempt's time budget (its setup
  grace, the longest it holds the machine, the machine's deadline) is protocols/attempt_time.py's,
  whose last candidate's setup grace is `last_grace_factor` times longer;
- before each lease, money is reserved (budget.py): the offer's price x the longest the attempt
  may hold the machine, against the batch's budget and the seed's `max_usd`; an offer neither can
  hold is passed over, and a walk that found stock only where money was short ends the job
  `budget` without renting anything. When the attempt ends its reservation is replaced by what it
  cost; both changes go to the ledger (`reservations`) and out as `Reserved` / `Charged` events;
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
from typing import Any, TypedDict

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
    Charged,
    ChildFailed,
    JobEnded,
    JobHead,
    Message,
    Offer,
    Reserved,
    Retrying,
    WaitingForCapacity,
    ended_outcome,
)
from actor_run.protocols.offload import to_thread
from actor_run.protocols.specs import Job
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.ledger.team import Held
from actor_run.supervisors.ledger.team import hold as team_hold
from actor_run.supervisors.tree.budget import Budget, BudgetChange, reservation_usd
from actor_run.supervisors.tree.offers import OfferBook
from actor_run.supervisors.tree.policy import (
    FAILURES,
    Action,
    Count,
    backoff_s,
    bigger_than,
    counts,
    decide,
    kind_limit,
    may_be_bigger,
)
from actor_run.supervisors.tree.seed_end import response_json, tidy_seed_dir
from actor_run.supervisors.tree.walk import Exhausted, NeedOffers, Walk


class _Offers(Message, frozen=True, kw_only=True):
    candidate: int
    result: Any


class _TeamHeld(Message, frozen=True, kw_only=True):
    """The ledger's answer to a hold against the team budget (a team.Held, or what went wrong)."""

    result: Any


class _Launch(Message, frozen=True, kw_only=True):
    wait: int = -1  # >= 0: the wake-up of that wait for capacity (only the first of its wake-ups counts)


# How long a job waits for capacity when its policy says nobody (`capacity_wait_s` unset), by the
# clouds it may use (the longest of its candidates'). Rented clouds: GPU stock comes and goes by
# the minute. The sim stands in for them, shorter. Your own machines (ssh, local): the job's
# `timeout_s`. A serverless endpoint queues jobs itself: none.
CAPACITY_WAIT_S: dict[str, float] = {"sim": 300.0, "runpod-serverless": 0.0}
RENTED_CAPACITY_WAIT_S = 1800.0
OWN_MACHINES = ("ssh", "local")
CAPACITY_ASK_MAX_S = 30.0  # the longest pause between two asks while waiting


def job_label(job: Job) -> str:
    """A JobSupervisor's label: what its log lines and its `ChildFailed` name it by."""
    return f"job:{job.name}/{job.seed}"


class JobSupervisor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: Job, ledger: Ledger,
                 first_attempt: int = 0, rng_seed: int | None = None, reattach: Reattach | None = None,
                 reattach_offer: Offer | None = None, offers: OfferBook | None = None,
                 seed_dir: Path, budget: Budget | None = None,
                 spent_before_usd: float = 0.0) -> None:
        super().__init__(ctx, parent, job_label(job))
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
        self.budget = budget if budget is not None else Budget(None)  # the batch's, shared by its jobs
        # the seed's own ceiling, counting what its attempts cost before a resume
        self.seed_budget = Budget(job.max_usd, spent_usd=spent_before_usd) if job.max_usd is not None else None
        self.account_at: dict[int, int] = {}  # candidate -> which of its accounts the walk is on
        self.short_of_money: list[str] = []  # offers this walk passed over for want of budget
        self.team_hold: tuple[Offer, BudgetChange, float] | None = None  # a hold the team budget has not answered
        self.reserved: float | None = None  # the running attempt's reservation
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
        self.waiting_since: float | None = None  # monotonic: since when no place has had stock
        self.wait_pause = 0.5
        self.wait_gen = 0  # the current wait for capacity (its wake-ups carry it)

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
            holder = (self.job.key, self.attempt_no)
            # the dead controller's reservation (the Runner adopted it from the ledger), or, for a
            # ledger without one, the machine's price up to its deadline: it runs already either way
            reserved = self.budget.reserved_for(holder)
            if reserved is None:
                reserved = reservation_usd(offer.hourly_usd, max(0.0, self.reattach.machine.deadline - time.time()))
                self.budget.adopt(holder, reserved)
            if self.seed_budget is not None:
                self.seed_budget.adopt(holder, reserved)
            self.reserved = reserved
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

                self.offers.ask(self.job.candidates[i], i, reply, account=self._account(i))
            case Exhausted():
                if self.short_of_money:
                    self._end("failed", Code.BUDGET, "no offer fits what is left of the budget: "
                              + "; ".join(self.short_of_money[-3:]))
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

    def _wait_for_capacity(self) -> None:
        """No candidate place has stock: wait for some (see the module docstring), or end."""
        now = time.monotonic()
        wait = self._capacity_wait()
        if self.waiting_since is None:
            self.waiting_since, self.wait_pause = now, 0.5
            if wait > 0:
                self.ctx.emit(WaitingForCapacity(**self.head, attempt=self.attempt_no, wanted=self._wanted(),
                                                 until=round(time.time() + wait, 3)))
        left = self.waiting_since + wait - now
        if left <= 0:
            last = self.history[-1] if self.history else None
            if last and last.get("failure") not in (None, Code.NO_CAPACITY):
                self._end("failed", Code(last["failure"]), last.get("detail", ""))
            else:
                waited = f" (waited {wait:.0f} s)" if wait > 0 else ""
                self._end("failed", Code.NO_CAPACITY, f"no candidate place has stock{waited}: {self._wanted()}")
            return
        self.walk = Walk(len(self.job.candidates), self.fits)  # stock may come back: walk again soon
        self.wait_gen += 1
        gen, ref = self.wait_gen, self.actor_ref

        def freed() -> None:  # on the thread of the job that let a machine go
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Launch(wait=gen))

        self.offers.when_freed(self.job.key, freed)
        self.later(min(self.wait_pause, left), _Launch(wait=gen))
        self.wait_pause = min(self.wait_pause * 2, CAPACITY_ASK_MAX_S)

    def _wanted(self) -> str:
        """What a waiting job waits for, in a line: each candidate's cloud, GPU and regions."""
        return "; ".join(f"{c.cloud} {c.gpu or 'any GPU'}" + (f" in {', '.join(c.regions)}" if c.regions else "")
                         for c in self.job.candidates)

    def _account(self, candidate: int) -> str:
        """The account candidate `candidate` is walked on now ("" when it names none)."""
        accounts = self.job.candidates[candidate].accounts
        return accounts[self.account_at.get(candidate, 0)] if accounts else ""

    def _next_account(self, offer: Offer) -> bool:
        """`offer`'s account is out of quota or balance: walk to the same place on the candidate's
        next account (True), or, after its last, past the candidate (False)."""
        i = offer.candidate
        accounts = self.job.candidates[i].accounts
        at = self.account_at.get(i, 0)
        if at + 1 < len(accounts):
            self.account_at[i] = at + 1
            self.walk.switch_account(offer, accounts[at + 1])
            return True
        self.walk.skip_candidate(i)
        return False

    def _capacity_wait(self) -> float:
        p = self.job.policy
        if p.capacity_wait_s is not None:
            return p.capacity_wait_s
        own = self.job.timeout_s
        return max((own if c.cloud in OWN_MACHINES else CAPACITY_WAIT_S.get(c.cloud, RENTED_CAPACITY_WAIT_S)
                    for c in self.job.candidates), default=0.0)

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
            self.walk.set_offers(candidate, [])
        else:
            self.walk.set_offers(candidate, result.value)
        self._next()

    def _timebox(self, offer: Offer) -> AttemptTime:
        """The time budget of an attempt on `offer` (the last candidate's grace is the longest)."""
        return attempt_time(self.job.policy, self.job.timeout_s, last=self.walk.is_last(offer))

    def _reserve(self, offer: Offer) -> float | None:
        """Set money aside for an attempt on `offer`: the seed's ceiling first, then the batch's.
        None (nothing held) if either cannot hold it."""
        self.ctx.at("budget", self.job.key)
        hold_s = self._timebox(offer).hold_s
        usd = reservation_usd(offer.hourly_usd, hold_s)
        holder = (self.job.key, self.attempt_no)
        where = f"{offer.cloud}{'/' + offer.account if offer.account else ''} {offer.region} {offer.gpu}".strip()
        if self.seed_budget is not None and self.seed_budget.reserve(holder, usd) is None:
            left = self.seed_budget.statistics()
            self.short_of_money.append(f"{where} needs ${usd:.2f}; the seed's max_usd has"
                                       f" ${(left.limit_usd or 0) - left.spent_usd - left.reserved_usd:.2f} left")
            return None
        change = self.budget.reserve(holder, usd)
        if change is None:
            if self.seed_budget is not None:
                self.seed_budget.release(holder, 0.0)
            left = self.budget.statistics()
            self.short_of_money.append(f"{where} needs ${usd:.2f}; the budget has"
                                       f" ${(left.limit_usd or 0) - left.spent_usd - left.reserved_usd:.2f} left")
            return None
        if self.job.policy.budget is not None:  # the team's budget too, in a transaction of the ledger's own
            self._hold_team(offer, change, hold_s)
            return change.usd
        self._reserved(offer, change, hold_s)
        return change.usd

    def _reserved(self, offer: Offer, change: BudgetChange, hold_s: float, team: str | None = None) -> None:
        self.ledger.record_reserved(job=self.job.key, attempt=self.attempt_no, offer=offer, hold_s=hold_s,
                                    usd=change.usd, seq=change.seq, limit_usd=change.limit_usd, budget=team)
        if change.usd > 0 or change.limit_usd is not None:  # a free machine under no budget: no money to show
            self.ctx.emit(Reserved(**self.head, attempt=self.attempt_no, usd=change.usd, offer=offer,
                                   hold_s=round(hold_s, 3), **_totals(change)))
        self.reserved = change.usd

    def _hold_team(self, offer: Offer, change: BudgetChange, hold_s: float) -> None:
        """Ask the ledger, off this thread (a reactor task hands it to a thread), to hold the
        reservation against the team budget; the answer comes back as `_TeamHeld`."""
        name = self.job.policy.budget
        assert name is not None
        row = self.ledger.reservation_row(job=self.job.key, attempt=self.attempt_no, offer=offer, hold_s=hold_s,
                                          usd=change.usd, seq=change.seq, limit_usd=change.limit_usd)
        self.team_hold = (offer, change, hold_s)
        ref, location = self.actor_ref, self.ledger.path

        async def ask() -> Held:
            return await to_thread(functools.partial(team_hold, location, budget=name, row=row))

        ledger, key, attempt, budgets = self.ledger, self.job.key, self.attempt_no, (self.budget, self.seed_budget)

        def reply(result: Result[Held]) -> None:  # on the reactor thread
            try:
                ref.tell(_TeamHeld(result=result))
            except pykka.ActorDeadError:  # the job ended meanwhile: a hold made for it is let go
                for b in budgets:  # (a Budget is arithmetic under its own lock: any thread)
                    if b is not None:
                        b.release((key, attempt), 0.0)
                if isinstance(result, outcome.Value) and result.value.ok:
                    ledger.record_charged(job=key, attempt=attempt, usd=0.0, at_least=False, seq=change.seq,
                                          seconds=0.0, outcome="failed", failure=Code.CANCELED)

        self.ctx.reactor.spawn(ask, on_done=reply, name="team-budget")

    def _team_held(self, result: Result[Held]) -> None:
        if self.team_hold is None:
            return
        offer, change, hold_s = self.team_hold
        self.team_hold = None
        name = self.job.policy.budget
        held = result.value if isinstance(result, outcome.Value) else None
        if self.ended or self.cancel is not None:  # let go: it ran nothing
            holder = (self.job.key, self.attempt_no)
            if self.seed_budget is not None:
                self.seed_budget.release(holder, 0.0)
            self.budget.release(holder, 0.0)
            if held is None or not held.ok:
                return
            self.ledger.record_charged(job=self.job.key, attempt=self.attempt_no, usd=0.0, at_least=False,
                                       seq=change.seq, seconds=0.0, outcome="failed", failure=Code.CANCELED)
            return
        if held is not None and held.ok:
            self._reserved(offer, change, hold_s, team=name)
            self._start_on(offer, change.usd)
            return
        holder = (self.job.key, self.attempt_no)
        if self.seed_budget is not None:
            self.seed_budget.release(holder, 0.0)
        self.budget.release(holder, 0.0)
        where = f"{offer.cloud} {offer.region} {offer.gpu}".strip()
        if held is None:
            error = result.error if isinstance(result, outcome.Error) else None
            self.short_of_money.append(f"{where}: the team budget {name!r} could not be read ({error})")
        elif held.budget is None:
            self.short_of_money.append(f"{where}: there is no team budget {name!r} (actor-run budget set {name} ...)")
        else:
            b = held.budget
            self.short_of_money.append(f"{where} needs ${change.usd:.2f}; the team budget {name!r} has"
                                       f" ${b.usd - b.spent_usd - b.reserved_usd:.2f} left of ${b.usd:.2f}")
        self.walk.pass_over(offer)
        self._next()

    def _charge(self, e: AttemptEnded) -> None:
        """The attempt ended: its machine is gone, and its reservation is replaced by what it cost."""
        holder = (self.job.key, e.attempt)
        if self.seed_budget is not None:
            self.seed_budget.release(holder, e.usage.usd)
        change = self.budget.release(holder, e.usage.usd)
        self.reserved = None
        self.ledger.record_charged(job=self.job.key, attempt=e.attempt, usd=e.usage.usd, at_least=e.usage.at_least,
                                   seq=change.seq, seconds=e.usage.seconds, outcome=e.outcome,
                                   failure=e.failure)
        if change.replaced_usd > 0 or e.usage.usd > 0 or change.limit_usd is not None:
            self.ctx.emit(Charged(**self.head, attempt=e.attempt, usd=change.usd,
                                  reserved=change.replaced_usd,
                                  at_least=e.usage.at_least, **_totals(change)))

    def _launch(self, offer: Offer, reserved_usd: float | None = None) -> None:
        capped = self.budget.statistics().limit_usd is not None or (
            self.seed_budget is not None and self.seed_budget.statistics().limit_usd is not None)
        if reserved_usd and capped:  # issue 45: a provider's own spend limit at what the attempt holds
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
            if isinstance(message, _TeamHeld):
                self._team_held(message.result)  # a hold made after the end is let go
            return None
        if self.ctx.fault is not None:
            self.ctx.at(f"event:{type(message).__name__}", self.job.key)
        match message:
            case _Offers(candidate=i, result=result):
                self._offers(i, result)
            case _TeamHeld(result=result):
                self._team_held(result)
            case _Launch(wait=wait):
                if wait >= 0:  # a wake-up of a wait for capacity: the first one counts
                    if wait != self.wait_gen or self.child is not None:
                        return None
                    self.wait_gen += 1
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
        self._charge(e)
        self.usd_done += e.usage.usd
        self.history.append({
            "attempt": e.attempt, "outcome": e.outcome, "failure": e.failure, "detail": e.detail,
            "cloud": e.offer.cloud if e.offer else "", "region": e.offer.region if e.offer else "",
            "gpu": e.offer.gpu if e.offer else "", "phases": e.phases, "usd": e.usage.usd,
            "usd_at_least": e.usage.at_least, "exit_code": e.exit_code, "reason": e.reason,
        })
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
        if code is Code.QUOTA and self.cancel is None and self.offer is not None and self._next_account(self.offer):
            self._next()  # no machine was made: at once, not counted
            return
        if code not in (Code.NO_CAPACITY, Code.QUOTA):
            self.counted += code not in UNCOUNTED
            self.waiting_since = None  # it found a place: a wait for capacity after this is a new one
            self.offers.freed()  # it held a machine, now let go: jobs waiting for capacity ask again
        tally = counts([h["failure"] for h in self.history], self.job.policy)
        kind, _ = kind_limit(code, self.job.policy)
        decision, self.failure_times = decide(code, counted_attempts=tally[FAILURES].used,
                                              failure_times=self.failure_times, now=time.monotonic(),
                                              policy=self.job.policy,
                                              kind_used=tally[kind].used if kind in tally else 0)
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
        self.retry_counts = tally
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
            if self.reserved is not None:
                holder = (self.job.key, self.attempt_no)
                if self.seed_budget is not None:
                    self.seed_budget.release(holder, self.reserved)
                self.budget.release(holder, self.reserved)
                self.reserved = None
        finally:
            super().on_failure(exception_type, exception_value, traceback)

    def on_stop(self) -> None:
        """Actor thread, after stop(): an attempt still running is stopped (its lease deletes the machine)."""
        self.cancel_tasks()
        if self.child is not None and self.child.is_alive():
            try:
                self.child.stop(block=True, timeout=self.ctx.delete_timeout_s + 90)
            except pykka.Timeout:
                self.log.error("attempt did not stop in time")


UNCOUNTED = (Code.NO_CAPACITY, Code.QUOTA, Code.AMBIGUOUS_CREATE)


def counted_attempts(history: list[Any]) -> int:
    """The attempts a job's history holds that count against max_attempts: walk steps (a place with
    no stock, `no_capacity`; an account out of quota, `quota`: no machine made) and creates the
    provider failed to answer (`ambiguous_create`: its transient fault, not the job's; what it made
    was found by name and deleted) are left out. The thrashing rule still bounds those."""
    return sum(1 for h in history if h.get("failure") not in UNCOUNTED)


class _TotalsDict(TypedDict):
    spent_usd: float
    reserved_usd: float
    budget_usd: float | None


def _totals(change: BudgetChange) -> _TotalsDict:
    """The batch's figures after a change, as the Reserved / Charged events carry them."""
    return {"spent_usd": round(change.spent_usd, 6), "reserved_usd": round(change.reserved_usd, 6),
            "budget_usd": change.limit_usd}
