"""Runner: the embedding API. A context manager (sync, or async in asyncio and trio) that owns the
reactor, the ledger, the clouds and the tree; `submit(job)` returns a `JobHandle`; `subscribe(fn)`
receives every event; `close()` (or leaving the `with` / `async with`) cancels what is unfinished
and deletes every machine before it returns.

    with Runner(out_dir="out") as runner:                # a thread, a task queue's worker
        handle = runner.submit(job)
        ended = handle.result()                          # a JobEnded event

    async with Runner(out_dir="out") as runner:          # asyncio or trio
        ended = await runner.submit(job).wait_async()

A cancellation of the task or scope around `async with` (asyncio's `wait_for`, `TaskGroup`,
`Task.cancel`; trio's `move_on_after`, a nursery's cancel) cancels the jobs and deletes every
machine before the block exits: the close runs to its end on a thread of its own, shielded from the
cancellation that caused it (and from a second one), which is raised again once it is done.

What a Runner submits is one *run* (`runner.run`, a short id): the ledger keeps its jobs, attempts
and events under it, with its output folder, recorded when the first job is submitted; `resume`
takes over jobs of other (dead) runs and keeps each in its own run and folder.

The Runner is composed of objects that hold nothing of it: the `Board` of handles (the port a
JobHandle talks through, and the line to the batch supervisor), the `EventBus`, the `Clouds` and the
`JobChecks`, and the `Takeover` (resume, sweep).

Threads: `subscribe` callbacks run on whichever actor thread emitted the event: keep them quick
(put the event on a queue). Everything else may be called from any thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import trio

from actor_run.actors import Context, Reactor, Task
from actor_run.actors.pool import POOL, blocking
from actor_run.protocols.clouds import Cloud
from actor_run.protocols.failures import ActorRunError, Code, RunnerClosed, SpecError, WaitTimeout
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Cancel, Event, JobEnded
from actor_run.protocols.offload import to_thread
from actor_run.protocols.specs import Job, redacted
from actor_run.supervisors.api import gc_tuning
from actor_run.supervisors.api.config import UserConfig, resolve_config
from actor_run.supervisors.api.event_bus import EventBus
from actor_run.supervisors.api.handle import Board, JobHandle, RunnerStatistics
from actor_run.supervisors.api.job_checks import Clouds, JobChecks
from actor_run.supervisors.api.places import check_out_dir, default_state_dir, new_run_id, private_dir
from actor_run.supervisors.api.shield import run_shielded
from actor_run.supervisors.api.takeover import Takeover
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.ledger.cancels import cancels_after, last_cancel
from actor_run.supervisors.ledger.db import Backend, open_backend
from actor_run.supervisors.ledger.db import resolve as resolve_ledger
from actor_run.supervisors.ledger.sweep import SweepAction
from actor_run.supervisors.tree.batch import Abandon, BatchSupervisor, CancelJob, Submit
from actor_run.supervisors.tree.budget import Budget, BudgetStatistics
from actor_run.supervisors.tree.seed_end import seed_dir

OWNER_BEAT_S = 30.0
CANCEL_POLL_S = 1.0  # how often a controller reads `actor-run cancel`'s requests from the ledger


class Runner:
    """The embedding API: runs Jobs, each in attempts on leased machines, and deletes every machine.

    Promises: every machine is in the ledger before its create call and is deleted (confirmed by
    its provider) before `close()` returns; each submitted job ends exactly once with a `JobEnded`
    (`outcome` "succeeded" or "failed" with a failure `Code`); transient failures are retried on
    a fresh machine up to the job's `policy.max_attempts`; at most `concurrency` jobs run at once and
    their total cost stays under `budget_usd` (jobs over it end `budget`).

    Use it as a context manager, `with` or `async with` (or call `open()` / `close()`); `submit(job)`
    returns a `JobHandle`;
    `subscribe(fn)` receives every event (on an actor thread: keep `fn` quick); `cancel()` stops
    everything; `wait()` waits for every submitted job. What one Runner submits is one run: `run` is
    its id in the ledger (`batch` names it for `actor-run runs`). `config` is the user settings file
    (a path, a `UserConfig`, or None for `$ACTOR_RUN_CONFIG` / the default file): its `[clouds.*]`
    tables are merged under each job's own. State (the ledger, known hosts, the local and sim clouds' folders)
    goes under `state_dir` (default: the platform's user state folder); outputs under `out_dir`.

    The cyclic garbage collector: while a Runner is open, the process's collector thresholds are
    raised from Python's (700, 10, 10) to (50000, 20, 20) (supervisors/api/gc_tuning.py `hold`), since
    at thousands of attempts at once Python's cost the controller a third of its CPU and stopped
    every thread for seconds (bench/RESULTS.md item 46); cycles are still collected, less often.
    Thresholds the host set itself, or a disabled collector, are left as they are; Python's come back
    when the last open Runner closes. `tune_gc=False` leaves the collector alone."""

    def __init__(self, *, out_dir: str | Path = "actor-run-out", ledger: str | Path | None = None,
                 state_dir: str | Path | None = None, concurrency: int = 4, budget_usd: float | None = None,
                 sweep_on_start: bool = True, delete_timeout_s: float = 120.0, meter_period_s: float = 5.0,
                 sweep_grace_s: float = 600.0, run: str | None = None, batch: str = "", lease_s: float = 60.0,
                 config: str | Path | UserConfig | None = None, outage_s: float | None = None,
                 register: bool = True, fault: Callable[[str, str], None] | None = None,
                 tune_gc: bool = True) -> None:
        self.state_dir = Path(state_dir).expanduser() if state_dir else default_state_dir()
        self.tune_gc = tune_gc  # raise the collector's thresholds while open (gc_tuning.hold)
        self._gc_held = False
        self._fault = fault  # fault injection (tests, drills): actors.Context.at says where it is called
        self.ledger_path = resolve_ledger(ledger, self.state_dir)  # a file, or a postgresql:// URL
        self.lease_s = lease_s
        self.outage_s = outage_s  # a shared ledger's outage ridden out (default: the lease): core.py
        self.register = register  # False: no owner row (a dry run that only reads)
        self.out_dir = Path(out_dir).expanduser().resolve()
        self.concurrency = concurrency
        self.budget_usd = budget_usd
        self.sweep_on_start = sweep_on_start
        self.sweep_grace_s = sweep_grace_s
        self.delete_timeout_s = delete_timeout_s
        self.meter_period_s = meter_period_s
        self.owner = uuid.uuid4().hex
        self.budget = Budget(budget_usd)  # reservations before leases (budget.py); figures kept even without a limit
        # this Runner's batch is a run: its id names it in the ledger, `actor-run runs` and --json events
        self.run = run or new_run_id()
        self.batch = batch
        self._run_started = False
        self._driven: set[str] = set()  # runs this Runner drove (its own, and those it resumed): ended at close
        self._enqueued: dict[str, Job] = {}  # the jobs it queued, secrets and all: what it claims of its own run
        self.cannot_run: set[tuple[str, str]] = set()  # (run, key) of queued jobs it claimed and put back: no cloud
        # of theirs can be used here (said once; `worker --until-idle` does not wait for them)
        self.reactor = Reactor()
        self.board = Board()  # the handles, their waiters, the line to the batch supervisor
        self._lock = threading.Lock()
        self._beat_task: Task | None = None
        self._cancel_task: Task | None = None
        self._cancel_backend: Backend | None = None
        self.ledger: Ledger = None  # type: ignore[assignment]  # set by open()
        self._open = False
        self._config_arg = config
        self.config = UserConfig()  # the user's settings, read by open()
        # the parts open() makes (they need the config and the ledger)
        self._clouds: Clouds | None = None
        self._checks: JobChecks | None = None
        self._bus: EventBus | None = None
        self._takeover: Takeover | None = None
        self._batch: Any = None  # the batch supervisor's ref while open (Board.tell is the way to it)
        self._early_subscribers: list[Callable[[Event], None]] = []  # subscribed before open()

    # --- opening and closing ---------------------------------------------------------------------

    def __enter__(self) -> Runner:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Runner:
        """Open on a thread of ours (the host's event loop keeps running). Cancelled meanwhile: the
        open runs to its end, then everything it started is closed before the cancellation goes on."""
        try:
            await run_shielded(self.open, "actor-run-open")
        except BaseException:
            await run_shielded(self.close, "actor-run-close")
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Close on a thread of ours, shielded: every job is cancelled and every machine deleted
        before the block exits, whatever cancels the host's task or scope meanwhile."""
        await run_shielded(self.close, "actor-run-close")

    def open(self) -> None:
        """Start the reactor, the ledger and the tree, and sweep (sweep_on_start). SpecError for a bad
        setting (nothing left running); on any failure what did start is closed again."""
        if self.concurrency < 1:
            raise SpecError("concurrency", f"expected int >= 1, got {self.concurrency}")
        self.config = resolve_config(self._config_arg)  # before anything starts: a bad file is a SpecError
        private_dir(self.state_dir)
        try:
            self._open_parts()
        except BaseException:
            self._open = True  # close() tears down what did start: no reactor or ledger writer left
            self.close()
            raise

    def _open_parts(self) -> None:
        if self.tune_gc and not self._gc_held:
            gc_tuning.hold()
            self._gc_held = True
        self.reactor.start()
        self.ledger = Ledger(self.ledger_path, self.owner, run=self.run, lease_s=self.lease_s, outage_s=self.outage_s)
        self.ledger.on_stale = self._lost
        self.ledger.on_failure = self._ledger_failed
        if self.register:
            self.ledger.register_owner()
        clouds = self._clouds = Clouds(config=self.config, state_dir=self.state_dir, ledger_path=self.ledger_path,
                                       owner=self.owner, sweep_grace_s=self.sweep_grace_s)
        clouds.ledger = self.ledger
        self._checks = JobChecks(clouds, self.reactor)
        self._bus = EventBus(self.ledger, self.board, self.budget_usd)
        for fn in self._early_subscribers:
            self._bus.subscribe(fn)
        self._takeover = Takeover(ledger=self.ledger, ledger_path=self.ledger_path, owner=self.owner,
                                  budget=self.budget, budget_usd=self.budget_usd, clouds=clouds, reactor=self.reactor,
                                  board=self.board, sweep_grace_s=self.sweep_grace_s, out_dir=self.out_dir,
                                  driven=self._driven, enqueued=self._enqueued, cannot_run=self.cannot_run)
        if self.sweep_on_start:
            clouds.on_new = self._takeover.sweep_new
        self.ctx = Context(reactor=self.reactor, clouds=clouds.by_key, ledger=self.ledger, emit=self._bus.emit,
                           owner=self.owner, out_root=self.out_dir, meter_period_s=self.meter_period_s,
                           delete_timeout_s=self.delete_timeout_s, fault=self._fault)
        self.board.connect(BatchSupervisor.start(self.ctx, self.ledger, concurrency=self.concurrency,
                                                 budget_usd=self.budget_usd, on_end=self._bus.job_ended,
                                                 budget=self.budget))
        self._batch = self.board._batch
        self._open = True
        self._beat()
        self._watch_cancels()
        if self.sweep_on_start:
            self._takeover.swept = self._takeover.sweep()

    # --- the parts, for whoever reads them ----------------------------------------------------------

    @property
    def handles(self) -> dict[str, JobHandle]:
        """Every job this Runner took (submitted, claimed, resumed), by key."""
        return self.board.handles

    @property
    def clouds(self) -> dict[str, Cloud]:
        """The clouds this Runner's leases use, by cloud key (empty until open)."""
        return self._clouds.by_key if self._clouds is not None else {}

    @property
    def swept(self) -> list[SweepAction]:
        """What this Runner's sweeps did: the start-up sweep, a resume's, each new cloud's."""
        return self._takeover.swept if self._takeover is not None else []

    @property
    def swept_clouds(self) -> list[str]:
        """The cloud keys the last sweep asked."""
        return self._takeover.swept_clouds if self._takeover is not None else []

    def _parts(self) -> tuple[Clouds, JobChecks, EventBus, Takeover]:
        if not self._open or self._clouds is None or self._checks is None or self._bus is None or \
                self._takeover is None:
            raise RunnerClosed("the Runner is not open (use `with Runner(...)` or `async with`)")
        return self._clouds, self._checks, self._bus, self._takeover

    def _beat(self) -> None:
        # on a shared ledger the beat renews a lease: three renewals per lease period
        period = min(OWNER_BEAT_S, self.lease_s / 3) if self.ledger.backend.fenced else OWNER_BEAT_S

        def beat() -> None:
            if self._open:
                if not self.ledger.beat_owner():
                    self._lost(set(self.ledger.tokens))
                self._beat_task = self.reactor.call_later(period, beat, name="owner-beat")

        self._beat_task = self.reactor.call_later(period, beat, name="owner-beat")

    def _watch_cancels(self) -> None:
        """Read `actor-run cancel`'s requests (ledger/cancels.py) every CANCEL_POLL_S, off the
        reactor's thread, and cancel the jobs this Runner runs (the machine is deleted first)."""
        backend = self._cancel_backend = open_backend(self.ledger_path)
        with backend.reading() as conn:
            start = last_cancel(conn)

        def read(after: int) -> list[tuple[int, str, str, str]]:
            with backend.reading() as conn:
                return cancels_after(conn, after)

        async def watch(last: int) -> None:
            while self._open:
                await trio.sleep(CANCEL_POLL_S)
                try:
                    rows = await to_thread(read, last)
                except backend.errors as exc:  # busy or gone for a moment: the next poll reads again
                    logger.warning("reading cancel requests: {}", exc)
                    continue
                for row_id, run, key, detail in rows:
                    last = row_id
                    if self.board.running(key) is not None and self.run_of(key) == run:
                        logger.bind(job=key).info("canceled from another process")
                        self.board.tell(CancelJob(key=key, detail=detail))

        self._cancel_task = self.reactor.spawn(watch, start, name="cancel-watch")

    def _lost(self, keys: set[str]) -> None:
        """On the ledger's thread: these jobs are no longer this controller's (fencing)."""
        logger.warning("{} job(s) taken over by another controller: letting them go", len(keys))
        with contextlib.suppress(RunnerClosed):
            self.board.tell(Abandon(keys=frozenset(keys)))

    def _ledger_failed(self, exc: BaseException) -> None:
        """On the ledger's thread: a write failed for a reason that is not the database's. What the
        ledger holds can no longer be trusted to be whole: every job ends (`internal`), each running
        attempt deleting its machine first, and the run ends with exit 1."""
        logger.error("the ledger could not record a write ({}: {}): ending the run, deleting every machine",
                     type(exc).__name__, exc)
        ctx = getattr(self, "ctx", None)  # None: it failed while the Runner was opening
        if ctx is not None:
            ctx.stop(Code.INTERNAL, f"the ledger's writer failed: {exc}")
        with contextlib.suppress(RunnerClosed):
            self.board.tell(Cancel(failure=Code.INTERNAL, detail=f"the ledger's writer failed: {exc}"))

    def cancel(self, failure: Code = Code.CANCELED, detail: str = "") -> None:
        """Cancel every job not finished: each running attempt deletes its machine first. Returns at
        once (the tree does the work); `wait()` or `close()` waits for it. RunnerClosed if not open.
        No create call starts after this returns, whatever is queued (`Context.stopping`, checked by
        each lease just before its create)."""
        if self._open:
            self.ctx.stop(failure, detail)
        self.board.tell(Cancel(failure=failure, detail=detail))

    def hand_back(self, timeout: float = 60.0) -> set[str]:
        """Give every job held here to the other controllers sharing the ledger (a worker's SIGTERM):
        nothing more is written about them, their machines are left running, this owner is closed
        so that the others adopt them at their next poll. Returns their keys. A shared ledger only."""
        keys = self.ledger.hand_back()
        if keys:
            self.board.tell(Abandon(keys=frozenset(keys)))
            handles = [h._future for h in self.board.handles.values() if h.key in keys]
            with blocking():
                concurrent.futures.wait(handles, timeout)
        self.ledger.close_owner()  # dead for everyone now: its jobs are orphans to adopt
        return keys

    def keep_run_open(self) -> None:
        """This Runner's run is the workers' (a shared ledger's `--submit-only`): closing the Runner
        does not end it; its last job does."""
        self._driven.discard(self.run)

    def wait(self, timeout: float | None = None) -> list[JobEnded]:
        """Block until every submitted job has ended (their `JobEnded`s, in submit order); raise
        WaitTimeout after `timeout` seconds. Wakes often enough for an interrupt to get through."""
        return self.board.wait(timeout)

    async def wait_async(self) -> list[JobEnded]:
        """`wait()` inside an asyncio or trio event loop, without blocking it."""
        return [await h.wait_async() for h in list(self.board.handles.values())]

    def close(self) -> None:
        """Cancel what is unfinished, wait until every machine is deleted, stop everything this
        Runner started (no thread of its own left running). Idempotent; any thread."""
        if not self._open:
            return
        try:
            if self.board.unfinished():
                self.cancel()
                try:
                    self.wait(timeout=self.delete_timeout_s + 180)
                except WaitTimeout:
                    logger.error("jobs did not end in time; stopping the tree (each lease deletes its machine)")
        finally:
            self._open = False
            if self._beat_task is not None:
                self._beat_task.cancel()
            if self._cancel_task is not None:
                self._cancel_task.cancel()
            batch, self._batch = self.board._batch, None
            self.board.connect(None)
            if batch is not None:
                batch.stop(block=True, timeout=self.delete_timeout_s + 240)
            for cloud in self.clouds.values():
                try:
                    self.reactor.call(cloud.aclose, timeout=30)
                except Exception as exc:  # closing a client must not stop the rest of the shutdown
                    logger.warning("closing cloud {}: {}", cloud.name, exc)
            self.reactor.stop()
            if self._cancel_backend is not None:
                self._cancel_backend.close()
            if self.ledger is not None:
                for run in sorted(self._driven):
                    self.ledger.end_run(run)
                self.ledger.close_owner()
                self.ledger.close()
            if self._gc_held:
                self._gc_held = False
                gc_tuning.let_go()

    # --- jobs --------------------------------------------------------------------------------------

    def start_run(self) -> str:
        """Record this Runner's run (its id, batch file, output folder) if not yet done; `submit`
        calls it. Returns the run's id (a new one if the chosen id was already in the ledger). Its
        first step makes the output folder and writes to it: SpecError(`out_dir`) if it cannot."""
        if not self._open:
            raise RunnerClosed("the Runner is not open (use `with Runner(...)` or `async with`)")
        if self._run_started:
            return self.run
        with self._lock:
            if not self._run_started:
                check_out_dir(self.out_dir)  # the first step: a folder results cannot go to starts nothing
                for _ in range(20):
                    if self.ledger.start_run(self.run, batch=self.batch, out_dir=str(self.out_dir)):
                        break
                    self.run = self.ledger.run = new_run_id()
                else:
                    raise ActorRunError("could not find a free run id in 20 tries")
                self._run_started = True
                self._driven.add(self.run)
                self._link_latest()
        return self.run

    def seed_dir(self, job: Job) -> Path:
        """Where a job of this Runner's run keeps its results (tree/seed_end.py `seed_dir`)."""
        return seed_dir(self.out_dir, self.run, job)

    def _link_latest(self) -> None:
        """`<out>/latest` -> this run's folder, replaced in one rename (a reader never sees none)."""
        (self.out_dir / self.run).mkdir(parents=True, exist_ok=True)
        link = self.out_dir / "latest"
        if link.exists() and not link.is_symlink():
            logger.warning("{} is not a link actor-run made: left as it is", link)
            return
        staged = self.out_dir / f".latest-{self.run}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(self.run, target_is_directory=True)
        os.replace(staged, link)

    def run_of(self, key: str) -> str:
        """The run the job `key` belongs to (this Runner's, or the one it resumed it from)."""
        return self.ledger.run_of(key) if self.ledger is not None else self.run

    def check(self, job: Job) -> None:
        """Raise SpecError (naming the field) for a job that cannot run here; nothing is started.
        Builds the clouds it names (and sweeps each new one, sweep_on_start)."""
        self._parts()[1].check(job)

    def check_settings(self) -> None:
        """Raise SpecError (naming the field and the settings file) for a default this process's
        settings give its jobs that cannot hold here: a team `budget` the ledger does not have. What a
        worker checks before it claims anything."""
        self._parts()[1].check_settings()

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        """`fn(event)` for every event from now on, on the emitting actor thread: keep it quick.
        May be called before `open()`."""
        if self._bus is None:
            self._early_subscribers.append(fn)
        else:
            self._bus.subscribe(fn)

    def submit(self, job: Job) -> JobHandle:
        """Check `job` and start it; its handle. SpecError for a job that cannot run (nothing
        started); RunnerClosed if the Runner is not open."""
        self._parts()
        self.start_run()
        job = self.config.job_defaults(job)  # the user config's team budget, unless its policy names one
        self.check(job)
        if self.board.running(job.key) is not None:
            raise SpecError("job", f"{job.key} is already running in this Runner")
        handle = self.board.add(job, self.run)
        folder = str(self.seed_dir(job))
        self.ledger.record_job(key=job.key, name=job.name, seed=job.seed, spec=msgspec.json.encode(redacted(job)),
                               state="running", out_dir=folder, run=self.run)
        self.board.tell(Submit(job=job, seed_dir=folder))
        return handle

    def enqueue(self, job: Job) -> None:
        """Record the job as queued in this Runner's run, for any controller's `claim` (a shared
        ledger); nothing runs here."""
        self.start_run()
        job = self.config.job_defaults(job)
        self.check(job)
        self.ledger.record_job(key=job.key, name=job.name, seed=job.seed, spec=msgspec.json.encode(redacted(job)),
                               state="queued", out_dir=str(self.seed_dir(job)), run=self.run)
        self._enqueued[job.key] = job

    def claim(self, most: int, run: str | None = None) -> list[JobHandle]:
        """Claim up to `most` queued jobs of `run` (None: of any run) from the ledger and run them
        here (takeover.py `Takeover.claim`)."""
        return self._parts()[3].claim(most, run, own_run=self.run)

    def resume(self, run: str | None = None, *, sweep_after: bool = True, take_runs: bool = True,
               most_new: int | None = None) -> list[JobHandle]:
        """Take over the unfinished jobs of dead controllers (takeover.py `Takeover.resume`)."""
        return self._parts()[3].resume(run, sweep_after=sweep_after, take_runs=take_runs, most_new=most_new)

    def sweep(self, *, dry_run: bool = False, owners_dead: Iterable[str] = ()) -> list[SweepAction]:
        """Delete the machines proven abandoned (takeover.py `Takeover.sweep`); what it did."""
        return self._parts()[3].sweep(dry_run=dry_run, owners_dead=owners_dead)

    def statistics(self) -> RunnerStatistics:
        """Counters for benches: actor messages handled, reactor tasks, ledger writes, pool threads."""
        pool = POOL.statistics()
        r = self.reactor.statistics()
        return RunnerStatistics(messages=pool["messages"], actor_turns=pool["turns"], pool_workers=pool["workers"],
                                reactor_tasks=r.tasks_started, reactor_timers=r.timers_started,
                                ledger_writes=self.ledger.writes)

    def budget_statistics(self) -> BudgetStatistics:
        """The batch's money now: its limit, live reservations, what ended attempts cost, what the
        running ones cost so far (the `Reserved` / `Charged` events carry the same totals)."""
        return self.budget.statistics()

    def spent_usd(self) -> float:
        """What the batch spent so far, as its supervisor counts it."""
        batch = self.board._batch
        if batch is None:
            raise RunnerClosed("the Runner is not open")
        return float(batch.ask("spent", block=True, timeout=10))
