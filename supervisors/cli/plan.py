"""`actor-run plan BATCH` (and `run --dry-run`): what a run would rent and what it could cost,
before anything is leased.

For each candidate, the live offers it resolves to now (cloud, account, region, GPU, $/h, stock),
in the order the walk tries them; then the money: an attempt on an offer holds `$/h x (timeout_s +
setup grace)` (protocols/attempt_time.py; the last candidate's grace is `last_grace_factor` times
longer), the batch at once holds up to `concurrency` such reservations, and the worst case of
the whole batch is every seed spending every attempt on its most expensive offer (a seed's
`max_usd` caps its share). That worst case is set against `budget_usd`.

On a terminal, `run` prints the plan's one-line summary first and asks before a batch whose worst
case passes the user config's `confirm_above_usd` (`--yes` skips; without a terminal it never asks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.attempt_time import attempt_time
from actor_run.protocols.clouds import Cloud, PassingOver, cloud_key, gpu_memory_gb
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import Batch, CandidateSpec
from actor_run.supervisors.api.config import UserConfig, load_config
from actor_run.supervisors.cli import batch_file
from actor_run.supervisors.cli.console import Exit
from actor_run.supervisors.cli.offers import ask, open_clouds
from actor_run.supervisors.cli.prompt import ask_line
from actor_run.supervisors.tree import oom_ladder
from actor_run.supervisors.tree.budget import reservation_usd

EXAMPLE = """examples:
  actor-run plan examples/sim.toml
  actor-run run examples/sim.toml --dry-run          # the same
  actor-run plan examples/runpod.toml --json
"""


class CandidatePlan(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    cloud: str
    gpu: str
    accounts: list[str]
    offers: list[Offer]
    error: str = ""  # what a cloud said instead of offers
    hold_s: float = 0.0  # the longest an attempt here may hold its machine
    attempt_usd: float | None = None  # the most one attempt here may cost (None: no offer, no price ceiling)
    passed_over: list[str] = []  # places with stock its clouds left out, and why (capabilities.PassingOver)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    jobs: int
    max_attempts: int
    concurrency: int
    budget_usd: float | None
    candidates: list[CandidatePlan]
    attempt_usd: float | None  # the most one attempt may cost anywhere (None: no candidate has a price)
    at_once_usd: float | None  # what the batch may hold at one moment
    worst_usd: float | None  # every seed, every attempt, at the most expensive offer
    on_oom: str = "bigger"
    # after `oom`, the candidates a job climbs, from the first (on_oom = "bigger"): (index, gpu, GB per machine)
    oom_order: list[tuple[int, str, float | None]] = msgspec.field(default_factory=list)
    fits: bool | None  # worst_usd <= budget_usd (None: no budget, or no price)

    def summary(self) -> str:
        """The one line `run` prints on a terminal."""
        first = next((o for c in self.candidates for o in c.offers), None)  # where the walk starts
        where = (f"first {cloud_key(first.cloud, first.account)} {first.gpu} {first.region} at "
                 f"{usd(first.hourly_usd)}/h".replace("  ", " ") if first else "no offer in stock now")
        return (f"plan: {self.jobs} job(s) x up to {self.max_attempts} attempt(s), {where}; "
                f"worst case {usd(self.worst_usd)}; {self.budget_line()}")

    def budget_line(self) -> str:
        if self.budget_usd is None:
            return "no budget_usd (nothing caps it)"
        if self.fits is None:
            return f"budget_usd {usd(self.budget_usd)} (no price known to compare)"
        if self.fits:
            return f"fits budget_usd {usd(self.budget_usd)}"
        return f"passes budget_usd {usd(self.budget_usd)}: jobs past it end `budget`"


def usd(value: float | None) -> str:
    """Money as people read it: sub-dollar amounts to 4 places, the rest to cents."""
    if value is None:
        return "unknown"
    return f"${value:.4f}" if abs(value) < 1 else f"${value:,.2f}"


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("plan", help="what a batch would rent now and its worst-case cost, before leasing anything",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch", help="a batch file (TOML)")
    p.add_argument("--json", action="store_true", help="the plan as one JSON object")
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def add_run_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument("--dry-run", action="store_true", help="print the plan (offers, walk, worst case) and exit")
    run.add_argument("--yes", "-y", action="store_true",
                     help="do not ask before a costly batch (the user config's confirm_above_usd)")


def make_plan(batch: Batch, config: UserConfig, state: Path) -> Plan:
    """Ask each candidate's clouds for offers now (read-only) and work out the money."""
    import trio  # the reactor's library: only when a cloud is asked (`actor-run --help` needs none of it)

    spec, policy = batch.spec, batch.spec.policy
    candidates = list(spec.candidates) or [CandidateSpec()]
    names = sorted({c.cloud for c in candidates})
    clouds, skipped = open_clouds(names, config, state, dict(spec.clouds), explicit=True)

    passed: list[list[str]] = [[] for _ in candidates]

    async def gather() -> list[list[Offer] | str]:
        answers: list[list[Offer] | str] = [[] for _ in candidates]

        async def one(i: int, c: CandidateSpec) -> None:
            found: list[Offer] = []
            for account in c.accounts or [""]:
                cloud: Cloud | None = clouds.get(cloud_key(c.cloud, account))
                if cloud is None:
                    answers[i] = skipped.get(c.cloud, f"no account {account!r}")
                    return
                got = await ask(cloud, c, i)
                if isinstance(got, str):
                    answers[i] = got
                    return
                found += got
                if isinstance(cloud, PassingOver):
                    passed[i] += cloud.passed_over(i)
            answers[i] = found

        try:
            async with trio.open_nursery() as nursery:
                for i, c in enumerate(candidates):
                    nursery.start_soon(one, i, c)
        finally:
            for cloud in clouds.values():
                await cloud.aclose()
        return answers

    answers = trio.run(gather)
    plans = []
    for i, (c, got) in enumerate(zip(candidates, answers, strict=True)):
        hold = attempt_time(policy, spec.job.timeout_s, last=i == len(candidates) - 1).hold_s
        offers = got if isinstance(got, list) else []
        prices = [o.hourly_usd for o in offers] or ([c.max_hourly_usd] if c.max_hourly_usd is not None else [])
        plans.append(CandidatePlan(index=i, cloud=c.cloud, gpu=c.gpu, accounts=list(c.accounts), offers=offers,
                                   error=got if isinstance(got, str) else "", hold_s=hold,
                                   attempt_usd=reservation_usd(max(prices), hold) if prices else None,
                                   passed_over=passed[i]))
    priced = [p.attempt_usd for p in plans if p.attempt_usd is not None]
    attempt = max(priced) if priced else None
    jobs = len(spec.job.seeds)
    worst = at_once = None
    if attempt is not None:
        per_seed = attempt * policy.max_attempts
        if spec.job.max_usd is not None:
            per_seed = min(per_seed, spec.job.max_usd)
        worst = per_seed * jobs
        at_once = attempt * min(policy.concurrency, jobs)
        if policy.budget_usd is not None:
            at_once = min(at_once, policy.budget_usd)
    fits = None if policy.budget_usd is None or worst is None else worst <= policy.budget_usd
    return Plan(jobs=jobs, max_attempts=policy.max_attempts, concurrency=policy.concurrency,
                budget_usd=policy.budget_usd, candidates=plans, attempt_usd=attempt, at_once_usd=at_once,
                worst_usd=worst, fits=fits, on_oom=policy.on_oom,
                oom_order=[(i, candidates[i].gpu, gpu_memory_gb(candidates[i].gpu)) for i in oom_ladder(candidates)])


def render(plan: Plan) -> str:
    lines = [f"{plan.jobs} job(s), up to {plan.max_attempts} attempt(s) each, {plan.concurrency} at once", ""]
    lines.append("offers now, in the order the walk tries them:")
    for c in plan.candidates:
        accounts = f" accounts {', '.join(c.accounts)}" if c.accounts else ""
        lines.append(f"  candidate {c.index}: {c.cloud} {c.gpu or 'any GPU'}{accounts}"
                     f" (an attempt holds up to {c.hold_s / 3600:.2f} h)")
        if c.error:
            lines.append(f"    no answer: {c.error}")
        elif not c.offers:
            lines.append("    nothing in stock now (the walk passes on to the next candidate)")
        lines += [f"    passed over: {why}" for why in c.passed_over]
        for o in c.offers:
            stock = f"  stock {o.stock}" if o.stock else ""
            image = f"  image {o.image}" if o.image else ""
            # on-demand and interruptible prices side by side
            other = (" interruptible" if o.interruptible else
                     f" (interruptible {usd(o.interruptible_usd)}/h)" if o.interruptible_usd else "")
            lines.append(f"    {cloud_key(o.cloud, o.account)}  {o.region or '-'}  {o.gpu or '-'}  "
                         f"{usd(o.hourly_usd)}/h{other}{stock}{image}  (an attempt reserves "
                         f"{usd(reservation_usd(o.hourly_usd, c.hold_s))})")
    lines.append("  then, if every place refused: every cloud is asked once more before a job fails no_capacity")
    if plan.on_oom == "fail":
        lines.append("out of memory: the job ends oom (on_oom = \"fail\")")
    else:
        steps = " -> ".join(f"candidate {i} {g or 'any GPU'}" + (f" ({m:g} GB)" if m is not None else "")
                            for i, g, m in plan.oom_order)
        lines.append(f"out of memory, each time on a candidate with more GPU memory: {steps or '-'}"
                     " (then the job ends oom)")
    lines += ["", "money:",
              f"  one attempt reserves at most {usd(plan.attempt_usd)}",
              f"  held at once (concurrency {plan.concurrency}): up to {usd(plan.at_once_usd)}",
              f"  worst case of the whole batch: {usd(plan.worst_usd)}"
              f" ({plan.jobs} seed(s) x {plan.max_attempts} attempt(s) at the most expensive offer)",
              f"  {plan.budget_line()}"]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace, batch: Batch | None = None) -> int:
    try:
        if batch is None:
            batch = batch_file.load(args)
        config = load_config(args.config)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    plan = make_plan(batch, config, Path(args.state_dir))
    if getattr(args, "json", False):
        sys.stdout.write(msgspec.json.encode(plan).decode() + "\n")
    else:
        print(render(plan))
    return Exit.FAILED if any(c.error for c in plan.candidates) else Exit.OK


def confirm(args: argparse.Namespace, batch: Batch) -> bool:
    """Before `run` starts, on a terminal: the plan's one-line summary, and a question when its
    worst case passes the user's `confirm_above_usd` (unless --yes). True: go on."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()) or args.json:
        return True  # never asks (nor spends calls on a plan) without a terminal
    config = load_config(args.config)
    plan = make_plan(batch, config, Path(args.state_dir))
    print(plan.summary(), flush=True)
    threshold = config.confirm_above_usd
    if args.yes or threshold is None or plan.worst_usd is None or plan.worst_usd <= threshold:
        return True
    try:
        answer = ask_line(f"the worst case passes confirm_above_usd {usd(threshold)}; run it? [y/N] ")
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


__all__ = ["Plan", "add_parser", "add_run_flags", "cmd_plan", "confirm", "make_plan", "render", "usd"]
