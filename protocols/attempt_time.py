"""An attempt's time budget, in one place: its setup grace, how long it may hold its machine, and the
machine's deadline.

An attempt gets the job's `timeout_s` to run plus `setup_grace_s` to set up (boot, upload, install
until the job's first work stage); on the last candidate of a job's walk the grace is
`last_grace_factor` times longer (the last place gets the most patience: nothing comes after it).
The money held for an attempt covers `hold_s` = timeout + grace. The machine's deadline, written
into its name so that a sweeper deletes it even when this computer is gone, is `deadline_margin_s`
past that: launch + timeout + grace + margin.

`plan` (the money a batch could hold), the job's actor (the reservation before an attempt) and the
attempt's actor (the lease's launch timeout, the heartbeat's setup window, the machine's deadline)
all read it from here.
"""

from __future__ import annotations

import msgspec

from actor_run.protocols.specs import PolicySpec


class AttemptTime(msgspec.Struct, frozen=True, kw_only=True):
    """The time one attempt is given (all in seconds): `timeout_s` to run, `setup_grace_s` to set up,
    `margin_s` more before its machine's deadline."""

    timeout_s: float
    setup_grace_s: float
    margin_s: float = 0.0

    @property
    def hold_s(self) -> float:
        """The longest the attempt holds its machine, what its reservation pays for: timeout plus grace."""
        return max(0.0, self.timeout_s + self.setup_grace_s)

    @property
    def until_deadline_s(self) -> float:
        """From launch to the machine's deadline: timeout + grace + margin."""
        return self.timeout_s + self.setup_grace_s + self.margin_s

    def deadline(self, launched_at: float) -> float:
        """The machine's deadline (epoch seconds) for an attempt launched at `launched_at`."""
        return launched_at + self.until_deadline_s


def attempt_time(policy: PolicySpec, timeout_s: float, *, last: bool = False) -> AttemptTime:
    """The time budget of an attempt of a job with `timeout_s` under `policy`; `last` when the
    attempt is on the last candidate of the job's walk (its grace is `last_grace_factor` longer)."""
    grace = policy.setup_grace_s * (policy.last_grace_factor if last else 1.0)
    return AttemptTime(timeout_s=timeout_s, setup_grace_s=grace, margin_s=policy.deadline_margin_s)
