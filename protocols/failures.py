"""The failure taxonomy: every failure carries one code, and the code alone decides what happens next.

Exceptions (whose fault it is)::

    ActorRunError                 base of everything this project raises on purpose
    ├── SpecError                 the user's batch file or arguments are wrong (exit 2)
    ├── HostError                 talking to a machine failed
    │   ├── Unreachable           the machine could not be reached (transient: wait, then `unreachable`)
    │   └── Refused               the machine answered and refused (`guard`, `input`)
    ├── LaunchError               a create call failed
    │   ├── LaunchRefused         clean: proves no machine exists (`no_capacity`, `quota`, `launch_failed`)
    │   └── LaunchAmbiguous       a machine may exist that we hold no id for (`ambiguous_create`)
    ├── DeleteUnconfirmed         the provider did not confirm a machine is gone
    ├── CallCancelled             a reactor call was cancelled or timed out (never a silent None)
    ├── RunnerClosed              the caller used a Runner that is not open
    └── WaitTimeout               a wait for jobs ran out of time (also a TimeoutError)
"""

from __future__ import annotations

import enum

import msgspec

from actor_run.protocols.redact import redact


class Code(enum.StrEnum):
    """Every failure's code (a str: `"job_failed"`); `POLICIES` says what each one leads to: the
    transient ones (no_capacity, quota, launch_failed, ambiguous_create, preempted, stalled,
    unreachable, retriable, oom) walk on or are retried on a fresh machine, the others end the job."""

    NO_CAPACITY = "no_capacity"
    QUOTA = "quota"  # the account is out of quota or balance: the same place on the next account
    LAUNCH_FAILED = "launch_failed"
    AMBIGUOUS_CREATE = "ambiguous_create"
    PREEMPTED = "preempted"
    STALLED = "stalled"
    UNREACHABLE = "unreachable"
    RETRIABLE = "retriable"  # the job's own verdict: not its code's fault (an NCCL error, a lost GPU): a fresh machine
    OOM = "oom"  # the job ran out of memory: the next attempt on a candidate with more GPU memory (`on_oom`)
    JOB_FAILED = "job_failed"
    INPUT = "input"
    TRANSFER_FAILED = "transfer_failed"  # the job's results could not come back within the transport's limits
    GUARD = "guard"
    DEADLINE = "deadline"
    BUDGET = "budget"
    CANCELED = "canceled"
    THRASHING = "thrashing"
    INTERNAL = "internal"


class Next(enum.StrEnum):
    """What the job supervisor does after an attempt failed with a code."""

    WALK = "walk"  # next candidate, no retry counted against this place
    RETRY = "retry"  # a fresh machine (same or next place), counts an attempt
    RECONCILE_RETRY = "reconcile_retry"  # delete by name first, then retry
    BIGGER = "bigger"  # retry on the next candidate with more GPU memory (policy `on_oom`), counts an attempt
    FINAL = "final"  # the job ends with this failure


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    next: Next
    walk: bool  # move down the candidate list before the next attempt
    transient: bool


POLICIES: dict[Code, Policy] = {
    Code.NO_CAPACITY: Policy(next=Next.WALK, walk=True, transient=True),
    Code.QUOTA: Policy(next=Next.WALK, walk=True, transient=True),
    Code.LAUNCH_FAILED: Policy(next=Next.RETRY, walk=True, transient=True),
    Code.AMBIGUOUS_CREATE: Policy(next=Next.RECONCILE_RETRY, walk=False, transient=True),
    Code.PREEMPTED: Policy(next=Next.RETRY, walk=False, transient=True),
    Code.STALLED: Policy(next=Next.RETRY, walk=False, transient=True),
    Code.UNREACHABLE: Policy(next=Next.RETRY, walk=False, transient=True),
    Code.RETRIABLE: Policy(next=Next.RETRY, walk=False, transient=True),
    Code.OOM: Policy(next=Next.BIGGER, walk=True, transient=True),
    Code.JOB_FAILED: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.INPUT: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.TRANSFER_FAILED: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.GUARD: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.DEADLINE: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.BUDGET: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.CANCELED: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.THRASHING: Policy(next=Next.FINAL, walk=False, transient=False),
    Code.INTERNAL: Policy(next=Next.FINAL, walk=False, transient=False),
}


def policy_for(code: Code) -> Policy:
    return POLICIES[code]


class ActorRunError(Exception):
    """Base of every exception this project raises on purpose. Its message never holds a secret
    value this process knows (protocols/redact.py): whatever text it is made from is masked."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class SpecError(ActorRunError):
    """The user's input is wrong: one line naming the field and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


class HostError(ActorRunError):
    """Talking to a machine failed."""


class Unreachable(HostError):
    """The machine could not be reached (a dropped connection, a host down)."""


class Refused(HostError):
    """The machine answered and refused: retrying would meet the same refusal."""

    def __init__(self, code: Code, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class MachineGone(HostError):
    """The provider took the machine away (a preemption); `at`: when, if the provider says (its
    bill stops there)."""

    def __init__(self, detail: str, at: float | None = None) -> None:
        super().__init__(detail)
        self.at = at


class LaunchError(ActorRunError):
    """A create call failed."""

    code: Code = Code.LAUNCH_FAILED

    def __init__(self, detail: str, code: Code | None = None) -> None:
        super().__init__(detail)
        if code is not None:
            self.code = code


class LaunchRefused(LaunchError):
    """Clean: the provider's answer proves no machine exists."""


class LaunchAmbiguous(LaunchError):
    """A machine may exist that we hold no id for: reconcile by name before anything else."""

    code = Code.AMBIGUOUS_CREATE


class DeleteUnconfirmed(ActorRunError):
    """The provider did not confirm the machine is gone: its ledger row stays open."""


class CallCancelled(ActorRunError):
    """A call into the reactor was cancelled or ran out of time."""


class RunnerClosed(ActorRunError):
    """The caller used a Runner that is not open (before `open()`/`with`, or after `close()`)."""


class WaitTimeout(ActorRunError, TimeoutError):
    """A wait for jobs to end ran out of time; the jobs go on (a TimeoutError too)."""
