"""A job's hold against its team budget (ledger/team.py), for job.py's JobSupervisor.

After the batch's budget and the seed's `max_usd` took a reservation (budget.py), a job whose policy
names a team budget asks the ledger to hold it there too, in a transaction of the ledger's own
(exact under concurrency: two controllers never both take the last dollars). The ask runs off the
actor's thread (a reactor task hands it to a worker thread) and its answer comes back as
`TeamHeld`. What an answer means is `refusal`'s: a budget too full now, whose live reservations
will be released, may have room later (`waitable`: the job waits for it with `on_budget_full =
"wait"`, waits.py); a budget that does not exist, could not be read, or whose period's spend alone
leaves no room for the reservation, will not.

A hold that is answered after its job ended (canceled meanwhile) is let go (`let_go`): the job's
own budgets give the reservation back, and a row the ledger wrote is closed as charged $0.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec
import outcome
import pykka

from actor_run.actors import Context, Result
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import Message
from actor_run.protocols.offload import to_thread
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.ledger.team import Held
from actor_run.supervisors.ledger.team import hold as team_hold
from actor_run.supervisors.tree.budget import Budget


class TeamHeld(Message, frozen=True, kw_only=True):
    """The ledger's answer to a hold against the team budget (a team.Held, or what went wrong)."""

    result: Any


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why a team budget did not hold a reservation: `line` for the job's end detail, and whether
    room may come back while the job waits (`waitable`)."""

    line: str
    waitable: bool


def ask(ctx: Context, ref: pykka.ActorRef[Any], ledger: Ledger, *, budget: str | None, row: dict[str, Any],
        seq: int, budgets: Sequence[Budget | None], batch_usd: float | None = None) -> None:
    """Ask the ledger to hold `row` (a reservations row) against the team budget `budget` and
    (`batch_usd`: a batch on a shared ledger) its run's own budget; the answer is told to `ref` as
    `TeamHeld`. Called on the job's actor thread; the transaction runs on
    a worker thread; the reply on the reactor thread. If the job is gone by then, a hold it made is
    let go there."""
    location, key, attempt = ledger.path, str(row["job"]), int(row["attempt"])

    async def held() -> Held:
        return await to_thread(functools.partial(team_hold, location, budget=budget, row=row, batch_usd=batch_usd))

    def reply(result: Result[Held]) -> None:  # on the reactor thread
        try:
            ref.tell(TeamHeld(result=result))
        except pykka.ActorDeadError:  # the job ended meanwhile: a hold made for it is let go
            let_go(ledger, key, attempt, seq, budgets, held=isinstance(result, outcome.Value) and result.value.ok)

    ctx.reactor.spawn(held, on_done=reply, name="team-budget")


def let_go(ledger: Ledger, key: str, attempt: int, seq: int, budgets: Sequence[Budget | None], *,
           held: bool) -> None:
    """A hold whose job runs nothing on it: its own budgets give the reservation back (a Budget is
    arithmetic under its own lock: any thread) and, when the team budget `held` it, its row is
    closed as charged $0 (canceled)."""
    for b in budgets:
        if b is not None:
            b.release((key, attempt), 0.0)
    if held:
        ledger.record_charged(job=key, attempt=attempt, usd=0.0, at_least=False, seq=seq, seconds=0.0,
                              outcome="failed", failure=Code.CANCELED)


def refusal(name: str | None, where: str, need_usd: float, result: Result[Held]) -> Refusal:
    """What a refused hold of `need_usd` (for an offer at `where`) against the team budget `name`
    (None: only the batch's own, on a shared ledger) says."""
    held = result.value if isinstance(result, outcome.Value) else None
    what = f"the team budget {name!r}" if name is not None else "the batch's budget_usd"
    if held is None:
        error = result.error if isinstance(result, outcome.Error) else None
        return Refusal(line=f"{where}: {what} could not be read ({error})", waitable=False)
    if held.batch_refused:  # as a batch's budget on one controller: passed over, the job ends `budget`
        assert held.batch is not None
        return Refusal(line=f"{where} needs ${need_usd:.2f}; the batch has ${held.batch.left_usd + need_usd:.2f} left "
                            f"of its ${held.batch.usd:.2f} budget_usd (what every worker reserved and spent for it)",
                       waitable=False)
    b = held.budget
    if b is None:
        return Refusal(line=f"{where}: there is no team budget {name!r} (actor-run budget set {name} ...)",
                       waitable=False)
    line = f"{where} needs ${need_usd:.2f}; the team budget {name!r} has ${b.left_usd:.2f} left of ${b.usd:.2f}"
    if need_usd > b.usd - b.spent_usd + 1e-9:  # what this period spent leaves too little, whatever is released
        spent = f"${b.spent_usd:.2f} spent" + (f" this {b.per}" if b.per != "total" else "")
        return Refusal(line=f"{line} ({spent}: no release makes room)", waitable=False)
    return Refusal(line=f"{line} (${b.reserved_usd:.2f} reserved by running attempts)", waitable=True)


__all__ = ["Refusal", "TeamHeld", "ask", "let_go", "refusal"]
