"""supervisors/tree/policy.py: what a failed attempt means for its job (DESIGN.md, "Failures"), and the
backoff between retries."""

from __future__ import annotations

import itertools
import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actor_run.protocols.failures import POLICIES, Code
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import CandidateSpec, PolicySpec
from actor_run.supervisors.tree.policy import (
    FAILURES,
    KINDS,
    Action,
    Count,
    Decision,
    backoff_s,
    bigger_than,
    counts,
    decide,
    kind_limit,
    may_be_bigger,
    oom_ladder,
)

POLICY = PolicySpec(max_attempts=5, thrash_max=5, thrash_window_s=300.0)

# DESIGN.md's table: code -> (action, walk past the place first)
TABLE: dict[Code, tuple[Action, bool]] = {
    Code.NO_CAPACITY: (Action.WALK, True),
    Code.QUOTA: (Action.WALK, True),
    Code.LAUNCH_FAILED: (Action.RETRY, True),
    Code.AMBIGUOUS_CREATE: (Action.RETRY, False),
    Code.PREEMPTED: (Action.RETRY, False),
    Code.STALLED: (Action.RETRY, False),
    Code.UNREACHABLE: (Action.RETRY, False),
    Code.RETRIABLE: (Action.RETRY, False),
    Code.OOM: (Action.RETRY, True),  # on a candidate with more GPU memory (`bigger`)
    Code.JOB_FAILED: (Action.STOP, False),
    Code.INPUT: (Action.STOP, False),
    Code.TRANSFER_FAILED: (Action.STOP, False),
    Code.GUARD: (Action.STOP, False),
    Code.DEADLINE: (Action.STOP, False),
    Code.BUDGET: (Action.STOP, False),
    Code.CANCELED: (Action.STOP, False),
    Code.THRASHING: (Action.STOP, False),
    Code.INTERNAL: (Action.STOP, False),
}


def test_the_table_covers_every_code() -> None:
    assert set(TABLE) == set(Code)
    assert set(POLICIES) == set(Code)


@pytest.mark.parametrize("code", list(Code))
def test_decide_follows_the_design_table(code: Code) -> None:
    decision, history = decide(code, counted_attempts=1, failure_times=[], now=1000.0, policy=POLICY)
    action, walk = TABLE[code]
    assert decision.action is action
    assert decision.walk is walk
    if action is Action.STOP:
        assert decision.code is code
        assert history == []  # a final failure is not a restart
    elif action is Action.WALK:
        assert decision.counts is False  # a place without stock costs no attempt
        assert history == []
    else:
        assert decision.code is None
        assert history == [1000.0]


@pytest.mark.parametrize("code", [c for c, (a, _) in TABLE.items() if a is Action.RETRY])
def test_max_attempts_stops_with_the_last_code(code: Code) -> None:
    # preemptions have a budget of their own by default: here they draw on max_attempts as the rest
    policy = msgspec.structs.replace(POLICY, max_attempts=3, max_preemptions=None)
    ok, _ = decide(code, counted_attempts=2, failure_times=[], now=10.0, policy=policy)
    assert ok.action is Action.RETRY
    stop, _ = decide(code, counted_attempts=3, failure_times=[], now=10.0, policy=policy)
    assert stop.action is Action.STOP
    assert stop.code is code
    assert "3 attempts used (max_attempts = 3)" in stop.detail


def test_no_capacity_never_runs_out_of_attempts() -> None:
    policy = msgspec.structs.replace(POLICY, max_attempts=1)
    d, _ = decide(Code.NO_CAPACITY, counted_attempts=50, failure_times=[], now=1.0, policy=policy)
    assert d == Decision(action=Action.WALK, walk=True, counts=False)


def test_thrashing_after_more_than_thrash_max_failures_in_the_window() -> None:
    policy = msgspec.structs.replace(POLICY, max_attempts=100, thrash_max=3, thrash_window_s=60.0)
    now = 1000.0
    # two earlier failures in the window: this third one is allowed
    d, history = decide(Code.STALLED, counted_attempts=3, failure_times=[now - 50, now - 10], now=now, policy=policy)
    assert d.action is Action.RETRY
    assert history == [now - 50, now - 10, now]
    # three earlier: the fourth within 60 s is one too many
    d, _ = decide(Code.STALLED, counted_attempts=4, failure_times=[now - 50, now - 10, now - 1], now=now, policy=policy)
    assert d.action is Action.STOP
    assert d.code is Code.THRASHING
    assert "more than 3 failed attempts within 60 s" in d.detail
    # the same three, but the oldest has left the window: allowed, and the history is pruned
    d, history = decide(
        Code.STALLED, counted_attempts=4, failure_times=[now - 61, now - 10, now - 1], now=now, policy=policy
    )
    assert d.action is Action.RETRY
    assert history == [now - 10, now - 1, now]


@given(
    earlier=st.lists(st.floats(min_value=0.0, max_value=200.0, allow_nan=False), max_size=12),
    thrash_max=st.integers(min_value=1, max_value=6),
    window=st.floats(min_value=1.0, max_value=150.0, allow_nan=False),
)
def test_thrashing_rule(earlier: list[float], thrash_max: int, window: float) -> None:
    policy = msgspec.structs.replace(POLICY, max_attempts=1000, thrash_max=thrash_max, thrash_window_s=window)
    now = 1000.0
    times = sorted(now - ago for ago in earlier)
    d, _ = decide(Code.PREEMPTED, counted_attempts=1, failure_times=times, now=now, policy=policy)
    in_window = sum(1 for t in times if now - t <= window)  # the window includes its edge, as OTP's does
    assert (d.action is Action.STOP) == (in_window >= thrash_max)
    if d.action is Action.STOP:
        assert d.code is Code.THRASHING


# --- backoff ----------------------------------------------------------------------------------------


class Fixed(random.Random):
    """A Random whose random() is always `u` (to see the jitter's ends)."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


@given(
    retry=st.integers(min_value=1, max_value=60),
    base=st.floats(min_value=0.001, max_value=10.0, allow_nan=False),
    cap=st.floats(min_value=0.001, max_value=120.0, allow_nan=False),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_is_jittered_in_half_to_full_of_a_capped_exponential(
    retry: int, base: float, cap: float, seed: int
) -> None:
    d = min(cap, base * 2.0 ** (retry - 1))
    got = backoff_s(retry, base_s=base, max_s=cap, rng=random.Random(seed))
    assert d / 2 <= got <= d
    assert got <= cap


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999999])
def test_backoff_doubles_until_the_cap(u: float) -> None:
    delays = [backoff_s(r, base_s=0.5, max_s=8.0, rng=Fixed(u)) for r in range(1, 9)]
    for a, b in itertools.pairwise(delays[:5]):  # 0.5 1 2 4 8: doubling
        assert b == pytest.approx(2 * a)
    assert delays[4:] == [delays[4]] * 4  # capped at 8 s
    assert delays[4] == pytest.approx(4.0 + 4.0 * u)


def test_backoff_ends_of_the_jitter_and_zero_base() -> None:
    assert backoff_s(3, base_s=1.0, max_s=60.0, rng=Fixed(0.0)) == pytest.approx(2.0)
    assert backoff_s(3, base_s=1.0, max_s=60.0, rng=Fixed(1.0)) == pytest.approx(4.0)
    assert backoff_s(0, base_s=1.0, max_s=60.0, rng=Fixed(1.0)) == pytest.approx(1.0)  # retry 0 counts as 1
    assert backoff_s(5, base_s=0.0, max_s=60.0, rng=Fixed(0.7)) == 0.0


# --- budgets per kind of failure ----------------------------------------------------------------------


def test_a_batch_that_sets_nothing_draws_every_kind_but_preemptions_on_max_attempts() -> None:
    p = PolicySpec()
    for code in KINDS:
        kind, limit = kind_limit(code, p)
        if code is Code.PREEMPTED:
            assert (kind, limit) == ("preemptions", 10)
        else:
            assert (kind, limit) == (FAILURES, None)


def test_a_preemption_budget_lets_a_job_go_past_max_attempts() -> None:
    policy = msgspec.structs.replace(POLICY, max_attempts=3, max_preemptions=5)
    for used in range(1, 6):  # the fifth preemption is still retried
        d, _ = decide(Code.PREEMPTED, counted_attempts=0, kind_used=used, failure_times=[], now=1.0, policy=policy)
        assert d.action is Action.RETRY
    d, _ = decide(Code.PREEMPTED, counted_attempts=0, kind_used=6, failure_times=[], now=1.0, policy=policy)
    assert d.action is Action.STOP
    assert d.code is Code.PREEMPTED
    assert d.detail == "6 preemptions (max_preemptions = 5)"


def test_on_oom_fail_ends_the_job_oom_and_bigger_retries() -> None:
    d, _ = decide(Code.OOM, counted_attempts=1, failure_times=[], now=1.0,
                  policy=msgspec.structs.replace(POLICY, on_oom="fail"))
    assert (d.action, d.code) == (Action.STOP, Code.OOM)
    d, _ = decide(Code.OOM, counted_attempts=1, failure_times=[], now=1.0, policy=POLICY)
    assert (d.action, d.bigger, d.walk) == (Action.RETRY, True, True)


_BUDGETED = list(KINDS)
_CODES = st.sampled_from([*_BUDGETED, Code.NO_CAPACITY, Code.QUOTA, Code.JOB_FAILED, None])
_LIMIT = st.one_of(st.none(), st.integers(min_value=0, max_value=6))


@given(failures=st.lists(_CODES, max_size=20), max_attempts=st.integers(min_value=1, max_value=6),
       limits=st.tuples(_LIMIT, _LIMIT, _LIMIT, _LIMIT, _LIMIT, _LIMIT))
def test_counts_put_each_failure_in_exactly_one_budget(failures: list[Code | None], max_attempts: int,
                                                       limits: tuple[int | None, ...]) -> None:
    fields = ("max_preemptions", "max_stalls", "max_unreachable", "max_launch_failures", "max_retriable",
              "max_oom_moves")
    policy = msgspec.structs.replace(POLICY, max_attempts=max_attempts, **dict(zip(fields, limits, strict=True)))
    c = counts(failures, policy)
    # walks and successes count nowhere; nor does a create left unanswered, unless launch failures
    # have a budget of their own (it then counts there)
    counted = [f for f in failures if f is not None and f not in (Code.NO_CAPACITY, Code.QUOTA)
               and not (f is Code.AMBIGUOUS_CREATE and policy.max_launch_failures is None)]
    assert sum(v.used for v in c.values()) == len(counted)
    assert c[FAILURES].limit == max_attempts
    for field, limit in zip(fields, limits, strict=True):
        kind = next(k for k, f in KINDS.values() if f == field)
        if limit is None:
            assert kind not in c  # drawn from max_attempts
        else:
            mine = [f for f in counted if KINDS.get(f, ("", ""))[1] == field]
            assert c[kind] == Count(used=len(mine), limit=limit)


@given(failures=st.lists(st.sampled_from(_BUDGETED), min_size=1, max_size=12),
       limit=st.integers(min_value=0, max_value=5))
def test_a_kind_with_its_own_budget_stops_exactly_past_it(failures: list[Code], limit: int) -> None:
    policy = msgspec.structs.replace(POLICY, max_attempts=1, max_preemptions=limit, max_stalls=limit,
                                     max_unreachable=limit, max_launch_failures=limit, max_retriable=limit,
                                     max_oom_moves=limit, thrash_max=1000)
    c = counts(failures, policy)
    kind, _ = kind_limit(failures[-1], policy)
    d, _ = decide(failures[-1], counted_attempts=c[FAILURES].used, kind_used=c[kind].used, failure_times=[],
                  now=1.0, policy=policy)
    assert (d.action is Action.STOP) == (c[kind].used > limit)


# --- out of memory: where a job may go next ----------------------------------------------------------


def _offer(gpu: str) -> Offer:
    return Offer(cloud="sim", gpu=gpu)


def test_bigger_than_compares_memory_per_machine() -> None:
    fits = bigger_than("A100-40G")
    assert fits is not None
    assert all(fits(_offer(g)) for g in ("A100-80G", "H100", "RTX4090:2"))  # 2 x 24 > 40
    assert not any(fits(_offer(g)) for g in ("RTX4090", "A100", "mystery-gpu"))
    assert bigger_than("mystery-gpu") is None
    h100 = bigger_than("H100")
    assert h100 is not None
    assert h100(_offer("H100:8"))
    assert not h100(_offer("A100-80G"))


def test_may_be_bigger_and_the_ladder() -> None:
    cands = [CandidateSpec(cloud="sim", gpu="A100-40G"), CandidateSpec(cloud="sim", gpu="RTX4090"),
             CandidateSpec(cloud="sim", gpu="A100-80G"), CandidateSpec(cloud="sim", gpu="L40S"),
             CandidateSpec(cloud="sim", gpu="H100:8")]
    assert oom_ladder(cands) == [0, 2, 4]
    assert may_be_bigger(cands, "A100-80G")
    assert not may_be_bigger(cands[:3], "A100-80G")
    assert may_be_bigger([CandidateSpec(cloud="sim")], "H100")  # any GPU: its offers are judged as they come


@given(gpus=st.lists(st.sampled_from(["A100", "A100-40G", "A100-80G", "H100", "H200", "L40S", "RTX4090", "A6000",
                                      "B200", "H100:8", "RTX4090:2", "unknown"]), min_size=1, max_size=8))
def test_the_ladder_climbs_strictly(gpus: list[str]) -> None:
    cands = [CandidateSpec(cloud="sim", gpu=g) for g in gpus]
    ladder = oom_ladder(cands)
    assert ladder[0] == 0
    assert ladder == sorted(ladder)
    for a, b in itertools.pairwise(ladder):
        fits = bigger_than(gpus[a])
        assert fits is not None
        assert fits(_offer(gpus[b]))
        # nothing between them was bigger than the step before it
        assert not any(fits(_offer(gpus[k])) for k in range(a + 1, b))
