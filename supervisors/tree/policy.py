"""What a failed attempt means for its job: decided from its failure code alone (failures.py),
the attempts used, and the restart intensity of attempts. Pure functions, no actors."""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence

import msgspec

from actor_run.protocols.failures import Code, Next, policy_for
from actor_run.protocols.specs import PolicySpec
from actor_run.supervisors.tree.intensity import restart_allowed


class Action(enum.StrEnum):
    WALK = "walk"  # the next place, at once (no machine was made)
    RETRY = "retry"  # a fresh machine after a backoff
    STOP = "stop"  # the job ends failed with `code`


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    code: Code | None = None  # the job's final failure when STOP
    walk: bool = False  # move past the current place before the next attempt
    counts: bool = True  # counts against max_attempts
    detail: str = ""


def decide(code: Code, *, counted_attempts: int, failure_times: Sequence[float], now: float,
           policy: PolicySpec) -> tuple[Decision, list[float]]:
    """The next step after an attempt failed with `code`. `counted_attempts` includes this one;
    `failure_times` are earlier failures' times (for the thrashing rule). Returns the decision and
    the failure history to keep."""
    rule = policy_for(code)
    if rule.next is Next.FINAL:
        return Decision(action=Action.STOP, code=code), list(failure_times)
    if rule.next is Next.WALK:
        return Decision(action=Action.WALK, walk=True, counts=False), list(failure_times)
    allowed, history = restart_allowed(failure_times, now, intensity=policy.thrash_max,
                                       period_s=policy.thrash_window_s)
    if not allowed:
        return Decision(action=Action.STOP, code=Code.THRASHING,
                        detail=f"more than {policy.thrash_max} failed attempts within {policy.thrash_window_s:.0f} s"
                        ), history
    if counted_attempts >= policy.max_attempts:
        return Decision(action=Action.STOP, code=code,
                        detail=f"{counted_attempts} attempts used (max_attempts = {policy.max_attempts})"), history
    return Decision(action=Action.RETRY, walk=rule.walk), history


def backoff_s(retry: int, *, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter in [d/2, d]: d = base * 2^(retry-1), at most max_s."""
    if base_s <= 0:
        return 0.0
    d = min(max_s, base_s * 2.0 ** max(0, retry - 1))
    return d / 2 + rng.random() * d / 2
