"""protocols/attempt_time.py: an attempt's setup grace, hold and deadline, the one computation that
plan, the job's actor and the attempt's actor share."""

from __future__ import annotations

from actor_run.protocols.attempt_time import AttemptTime, attempt_time
from actor_run.protocols.specs import PolicySpec

POLICY = PolicySpec(setup_grace_s=600, last_grace_factor=2.0, deadline_margin_s=900)


def test_an_attempt_holds_its_machine_for_timeout_plus_grace() -> None:
    t = attempt_time(POLICY, 3600)
    assert (t.setup_grace_s, t.hold_s) == (600, 4200)


def test_the_last_candidate_gets_the_longer_grace() -> None:
    t = attempt_time(POLICY, 3600, last=True)
    assert (t.setup_grace_s, t.hold_s) == (1200, 4800)


def test_the_deadline_is_the_margin_past_the_hold() -> None:
    t = attempt_time(POLICY, 3600)
    assert t.until_deadline_s == 3600 + 600 + 900
    assert t.deadline(launched_at=1_000_000.0) == 1_000_000.0 + 5100
    assert attempt_time(POLICY, 3600, last=True).deadline(0.0) == 3600 + 1200 + 900


def test_a_hold_is_never_negative() -> None:
    assert AttemptTime(timeout_s=-10, setup_grace_s=5).hold_s == 0.0
