"""What a failed attempt means for its job: decided from its failure code alone (failures.py),
the attempts used (against `max_attempts`, or against the budget of the failure's kind: `KINDS`),
and the restart intensity of attempts; where an out-of-memory job may go next (`bigger_than`,
`oom_ladder`). Pure functions, no actors."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from actor_run.protocols.clouds import gpu_memory_gb
from actor_run.protocols.failures import Code, Next, policy_for
from actor_run.protocols.messages import BudgetCount, Offer
from actor_run.protocols.specs import CandidateSpec, PolicySpec
from actor_run.supervisors.tree.intensity import restart_allowed

# the kinds of failure that may have budgets of their own, and the policy field that holds each
KINDS: dict[Code, tuple[str, str]] = {
    Code.PREEMPTED: ("preemptions", "max_preemptions"),
    Code.STALLED: ("stalls", "max_stalls"),
    Code.UNREACHABLE: ("unreachable", "max_unreachable"),
    Code.LAUNCH_FAILED: ("launch_failures", "max_launch_failures"),
    Code.AMBIGUOUS_CREATE: ("launch_failures", "max_launch_failures"),
    Code.RETRIABLE: ("retriable", "max_retriable"),
    Code.OOM: ("oom_moves", "max_oom_moves"),
}
FAILURES = "failures"  # the count of failed attempts drawn from max_attempts
UNCOUNTED = (Code.NO_CAPACITY, Code.QUOTA, Code.AMBIGUOUS_CREATE)  # no attempt used (counted_attempts)


def kind_limit(code: Code, policy: PolicySpec) -> tuple[str, int | None]:
    """The kind a failure with `code` counts as and its own budget; (FAILURES, None) when it has
    none and draws on `max_attempts`."""
    kind = KINDS.get(code)
    if kind is None:
        return FAILURES, None
    limit: int | None = getattr(policy, kind[1])
    return (kind[0], limit) if limit is not None else (FAILURES, None)


def counted_attempts(history: list[Any]) -> int:
    """The attempts a job's history holds that count against max_attempts: walk steps (a place with
    no stock, `no_capacity`; an account out of quota, `quota`: no machine made) and creates the
    provider failed to answer (`ambiguous_create`: its transient fault, not the job's; what it made
    was found by name and deleted) are left out. The thrashing rule still bounds those."""
    return sum(1 for h in history if h.get("failure") not in UNCOUNTED)


Count = BudgetCount  # a budget's count against its limit: the events that carry it say it (Retrying, JobEnded)


def counts(failures: Sequence[Code | None], policy: PolicySpec) -> dict[str, Count]:
    """Each budget's count against its limit, after attempts that failed with `failures` (None: it
    succeeded; walks past places without stock (`no_capacity`, `quota`) count nowhere): `failures`
    against max_attempts, and every kind with a budget of its own (those set, used or not)."""
    used: dict[str, int] = {FAILURES: 0}
    limits: dict[str, int] = {FAILURES: policy.max_attempts}
    for kind, field in KINDS.values():
        limit = getattr(policy, field)
        if limit is not None:
            used.setdefault(kind, 0)
            limits[kind] = limit
    for failure in failures:
        if failure is None or policy_for(failure).next is Next.WALK:
            continue
        if failure is Code.AMBIGUOUS_CREATE and policy.max_launch_failures is None:
            continue  # a create left unanswered is no attempt (UNCOUNTED): the thrash guard bounds it
        kind, _ = kind_limit(failure, policy)
        used[kind] = used.get(kind, 0) + 1
    return {k: Count(used=used[k], limit=limits[k]) for k in used}


def counts_text(c: dict[str, Count]) -> str:
    """`failures 1/3, preemptions 3/5`: each count against its limit, for a line of text."""
    return ", ".join(f"{k} {v.used}/{v.limit}" for k, v in c.items())


class Action(enum.StrEnum):
    WALK = "walk"  # the next place, at once (no machine was made)
    RETRY = "retry"  # a fresh machine after a backoff
    STOP = "stop"  # the job ends failed with `code`


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    code: Code | None = None  # the job's final failure when STOP
    walk: bool = False  # move past the current place before the next attempt
    counts: bool = True  # counts against max_attempts
    bigger: bool = False  # the next attempt only on a candidate with more GPU memory (after `oom`)
    detail: str = ""


def decide_after(code: Code, failures: Sequence[Code | None], *, failure_times: Sequence[float], now: float,
                 policy: PolicySpec) -> tuple[Decision, list[float]]:
    """`decide` for a job whose attempts failed with `failures` (the last one with `code`), counted
    against `max_attempts` and their kinds' own budgets (`counts`)."""
    tally = counts(failures, policy)
    kind, _ = kind_limit(code, policy)
    return decide(code, counted_attempts=tally[FAILURES].used, failure_times=failure_times, now=now, policy=policy,
                  kind_used=tally[kind].used if kind in tally else 0)


def decide(code: Code, *, counted_attempts: int, failure_times: Sequence[float], now: float,
           policy: PolicySpec, kind_used: int = 0) -> tuple[Decision, list[float]]:
    """The next step after an attempt failed with `code`. `counted_attempts`: the failures drawn
    from max_attempts, this one included if it draws there; `kind_used`: the failures of this one's
    kind (`KINDS`), this one included, which count against the kind's own budget when it has one;
    `failure_times` are earlier failures' times (for the thrashing rule). Returns the decision and
    the failure history to keep. An `oom` retry says `bigger` (the caller walks to more GPU memory)."""
    rule = policy_for(code)
    if rule.next is Next.FINAL:
        return Decision(action=Action.STOP, code=code), list(failure_times)
    if rule.next is Next.WALK:
        return Decision(action=Action.WALK, walk=True, counts=False), list(failure_times)
    if rule.next is Next.BIGGER and policy.on_oom == "fail":
        return Decision(action=Action.STOP, code=code, detail='on_oom = "fail"'), list(failure_times)
    allowed, history = restart_allowed(failure_times, now, intensity=policy.thrash_max,
                                       period_s=policy.thrash_window_s)
    if not allowed:
        return Decision(action=Action.STOP, code=Code.THRASHING,
                        detail=f"more than {policy.thrash_max} failed attempts within {policy.thrash_window_s:.0f} s"
                        ), history
    kind, limit = kind_limit(code, policy)
    if limit is None:
        if counted_attempts >= policy.max_attempts:
            return Decision(action=Action.STOP, code=code,
                            detail=f"{counted_attempts} attempts used (max_attempts = {policy.max_attempts})"), history
    elif kind_used > limit:
        return Decision(action=Action.STOP, code=code,
                        detail=f"{kind_used} {kind} ({KINDS[code][1]} = {limit})"), history
    return Decision(action=Action.RETRY, walk=rule.walk, bigger=rule.next is Next.BIGGER), history


def bigger_than(gpu: str) -> Callable[[Offer], bool] | None:
    """After an out-of-memory end on a machine of `gpu`: whether an offer has more GPU memory (per
    machine: `H100:8` counts eight). None when the GPU table does not know `gpu`'s memory."""
    floor = gpu_memory_gb(gpu)
    if floor is None:
        return None

    def fits(offer: Offer) -> bool:
        memory = gpu_memory_gb(offer.gpu)
        return memory is not None and memory > floor

    return fits


def may_be_bigger(candidates: Sequence[CandidateSpec], gpu: str) -> bool:
    """Whether any candidate could offer more GPU memory than `gpu`: one naming a bigger GPU, or one
    naming none (its offers are judged as they come)."""
    floor = gpu_memory_gb(gpu)
    if floor is None:
        return False
    return any(not c.gpu or (gpu_memory_gb(c.gpu) or 0.0) > floor for c in candidates)


def oom_ladder(candidates: Sequence[CandidateSpec]) -> list[int]:
    """The order a job that keeps running out of memory climbs the candidates, from the first: each
    step the next candidate (in the list's order) with more GPU memory than the last. Candidates
    whose GPU the table does not know are not on it (after the first)."""
    if not candidates:
        return []
    ladder = [0]
    floor = gpu_memory_gb(candidates[0].gpu)
    for i, c in enumerate(candidates[1:], start=1):
        memory = gpu_memory_gb(c.gpu)
        if floor is not None and memory is not None and memory > floor:
            ladder.append(i)
            floor = memory
    return ladder


def backoff_s(retry: int, *, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter in [d/2, d]: d = base * 2^(retry-1), at most max_s."""
    if base_s <= 0:
        return 0.0
    d = min(max_s, base_s * 2.0 ** max(0, retry - 1))
    return d / 2 + rng.random() * d / 2
