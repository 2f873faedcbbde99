"""The supervision tree's controller half: the batch and job supervisors and the decisions they ask.

    batch.py         BatchSupervisor: the run's jobs, at most `concurrency` at once; its messages
                     (Submit, CancelJob, Abandon, Spent) are what the embedding API tells it
    job.py           JobSupervisor: one per job; starts one AttemptActor after the other
    job_money.py     a job's money: reservations against the seed's and the batch's budgets, charges
    team_hold.py     a job's hold against a team budget across runs (the ledger's), and what a refusal means
    waits.py         a job's waits for a machine: for stock, for room in a team budget
    seed_end.py      what a job leaves in its folder (response.json, the tidy-up)
    policy.py        what an attempt's end means: retry here, walk on, give up (by failure code)
    walk.py          the capacity walk across candidates
    offers.py        the offers book: live offers per candidate, shared by the run's jobs
    budget.py        reservations before leases, the money of a run
    reservations.py  settling the reservations of machines a sweep deleted
    intensity.py     OTP's restart intensity, a pure function (the thrash guard)

The tree's rules (supervisor.erl's words, written once here; each actor's docstring says its part):
- BatchSupervisor starts a JobSupervisor per job (at most `concurrency` at once, in submit order);
  each job supervisor starts one AttemptActor at a time (restart type: transient: a new attempt
  only after a failure the policy calls transient), within the job's retry budget and the restart
  intensity of `intensity.restart_allowed`.
- An AttemptActor starts its children in this order, each when its first message is known:
  LeaseActor, then CostMeterActor and TransferActor on `Leased`, then HeartbeatActor once the job
  started; it stops them in the reverse order, each waited for (actors/attempt.py). Strategy:
  one_for_all: any child's failure ends the attempt, and the lease's stop hook deletes the machine.
- Shutdown: `Runner.close()` cancels every job, waits for the machines to be deleted, then stops
  the batch supervisor, which stops its job supervisors, each its attempt (reverse start order).
- A failure a supervisor did not expect is its child's failure (`internal`), never its own.

What it may import: protocols, actors, the ledger. Never the embedding API (supervisors.api), the
views or the command line: they stand on the tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy

if TYPE_CHECKING:  # what a type checker reads; at run time each name loads on first use (PEP 562)
    from actor_run.supervisors.tree.batch import BatchSupervisor
    from actor_run.supervisors.tree.budget import Budget, BudgetStatistics
    from actor_run.supervisors.tree.job import JobSupervisor
    from actor_run.supervisors.tree.policy import counts, counts_text, oom_ladder

_WHERE = {
    "BatchSupervisor": "actor_run.supervisors.tree.batch",
    "Budget": "actor_run.supervisors.tree.budget",
    "BudgetStatistics": "actor_run.supervisors.tree.budget",
    "JobSupervisor": "actor_run.supervisors.tree.job",
    "counts": "actor_run.supervisors.tree.policy",
    "counts_text": "actor_run.supervisors.tree.policy",
    "oom_ladder": "actor_run.supervisors.tree.policy",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy.exports(globals(), _WHERE)

__all__ = ["BatchSupervisor", "Budget", "BudgetStatistics", "JobSupervisor", "counts", "counts_text", "oom_ladder"]
