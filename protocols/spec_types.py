"""The structs a batch file decodes into, and the `Job` the Runner runs: `JobSpec` (`[job]`),
`PolicySpec` (`[policy]`), `CandidateSpec` (`[[candidates]]`), `BatchFile` (the whole file), `Job`
(one seed of a batch) and `job_key` (how a job is named everywhere).

Data only: the values are checked in protocols/spec_checks.py, secrets handled in
protocols/spec_secrets.py, and a batch read and made in protocols/specs.py, where every public name
of the three is importable too (`from actor_run.protocols.specs import Job`). Imports nothing of
the project beyond protocols/messages.py.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import msgspec

from actor_run.protocols.messages import CacheSpec


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    command: str
    seeds: list[int]
    code: str | None = None
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_s: float = 3600.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    max_usd: float | None = None  # per seed: what all of one seed's attempts may cost together
    # names whose values are secrets besides those that look secret (KEY, TOKEN, ...): masked in the
    # ledger and every text, and taken from the environment of whoever runs the job when env lacks them
    secret_env: list[str] = msgspec.field(default_factory=list)
    # kept for batches written before secret_env: plain values are plain already (names here stay plain)
    public_env: list[str] = msgspec.field(default_factory=list)


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a job is retried and watched (`[policy]`; public as `actor_run.Policy`).

    A job gets at most `max_attempts` attempts, each on a fresh machine; a transient failure waits
    `backoff_s` (doubling, with jitter, up to `backoff_max_s`) before the next. An attempt whose job
    writes no progress for `setup_grace_s` (before its first work stage) or `stall_after_s` (after)
    ends `stalled`. `concurrency` and `budget_usd` are the batch's: the CLI hands them to the Runner.
    Every field has a default; `check_policy` (run by the Runner) refuses impossible values.

    A budget per kind of failure: a kind whose `max_<kind>` is set counts its own failures (the job
    goes on after at most that many, one more ends it) and draws nothing from `max_attempts`; a kind
    left unset (None) draws on `max_attempts` as every failure did before. Preemptions have their own
    budget by default (`max_preemptions = 10`): a spot machine taken away is nobody's failure, and
    the thrash guard, the deadline and the budget still bound a job that is preempted again and again.
    The job's own verdict: a progress line `{"retriable": true, "reason": ...}` before a non-zero exit,
    or an exit code in `retry_on_exit`, ends the attempt `retriable` (retried on a fresh machine);
    `on_oom = "bigger"` moves a job that ran out of memory to the next candidate with more GPU memory,
    `"fail"` ends it `oom`."""

    max_attempts: int = 3
    concurrency: int = 4
    budget_usd: float | None = None
    # a team budget across runs it draws on too (`actor-run budget set`); None: the user config's
    # `budget` if it names one; "": none, not even that
    budget: str | None = None
    # a team budget too full for a job's reservation: "wait" for room (its run's reservations released,
    # and asked again every few seconds, up to capacity_wait_s), or "end" the job `budget` at once.
    # A budget whose period's spend alone leaves no room ends it at once either way
    on_budget_full: str = "wait"
    setup_grace_s: float = 600.0
    stall_after_s: float = 300.0
    lost_after_s: float = 120.0  # a host silent this long is `unreachable`; its watchdog ends the job after it
    poll_s: float = 2.0  # heartbeat period
    backoff_s: float = 1.0  # first retry delay; doubles, with jitter, up to backoff_max_s
    backoff_max_s: float = 60.0
    thrash_max: int = 5  # more than this many failed attempts within thrash_window_s: `thrashing`
    thrash_window_s: float = 300.0
    last_grace_factor: float = 2.0  # the last candidate's setup grace is this many times longer
    deadline_margin_s: float = 900.0  # a machine's deadline: launch + timeout_s + setup grace + this
    # when no candidate has stock, wait this long for some (walking again every few seconds) before
    # failing `no_capacity`; default: 0 for clouds, the job's timeout_s when a candidate is your own
    # SSH hosts (their slots free up as your own attempts finish)
    capacity_wait_s: float | None = None
    retry_on_exit: list[int] = msgspec.field(default_factory=list)  # exit codes that mean `retriable`
    on_oom: str = "bigger"  # "bigger": the next candidate with more GPU memory; "fail": the job ends `oom`
    max_preemptions: int | None = 10  # None (or unset kinds below): drawn from max_attempts
    max_stalls: int | None = None
    max_unreachable: int | None = None
    max_launch_failures: int | None = None  # launch_failed and ambiguous_create
    max_retriable: int | None = None  # the job's own `retriable` verdicts
    max_oom_moves: int | None = None  # moves to a bigger GPU after `oom`
    # the most of a job's log kept in its log.txt per attempt (MB): a longer log keeps its head and
    # its tail (the last lines always), with one line where the middle was cut
    log_max_mb: float = 64.0



class CandidateSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One place a job may run (`[[candidates]]`; public as `actor_run.Candidate`): a cloud and,
    optionally, a GPU shape (`H100` is one H100, `H100:8` a machine with eight), regions (or, for
    `ssh`, host names) and a price ceiling (the machine's, not one GPU's). A job walks its
    candidates in order: when one has no capacity the next is tried. `image` is what the machine
    boots (a cloud that takes one: RunPod and serverless container images, Hyperstack and Lambda
    image names, SkyPilot image_id); unset, each cloud picks per region an image whose CUDA meets
    the GPU class's floor (protocols/clouds/gpus.py `CUDA_FLOOR`)."""

    cloud: str = "local"
    gpu: str = ""
    image: str = ""
    cache: CacheSpec | None = None
    regions: list[str] = msgspec.field(default_factory=list)
    hosts: list[str] = msgspec.field(default_factory=list)
    max_hourly_usd: float | None = None
    # the cloud's accounts to use, in order ([clouds.<cloud>.accounts.<name>]); "main" or "" is the
    # cloud's own settings. A refusal meaning an account is out of quota or balance tries the same
    # place on the next one
    accounts: list[str] = msgspec.field(default_factory=list)
    # --- interruptible capacity (Vast bids, Shadeform spot): rented cheaper, taken back at any time
    # (the attempt ends `preempted`); `max_bid_usd` caps a Vast bid ($/h per machine; default: the
    # offer's minimum bid and a margin)
    interruptible: bool = False
    max_bid_usd: Annotated[float, msgspec.Meta(gt=0)] | None = None


class BatchFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    job: JobSpec
    policy: PolicySpec = msgspec.field(default_factory=PolicySpec)
    candidates: list[CandidateSpec] = msgspec.field(default_factory=list)
    clouds: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One seed of a batch, with everything needed to run it: what `Runner.submit` takes.

    `command` runs in a shell on the machine, in a copy of the folder `code`, with `$ACTOR_RUN_SEED`,
    `$ACTOR_RUN_ATTEMPT`, `$ACTOR_RUN_GPU` (the GPU class it runs on), `$ACTOR_RUN_IN` (the `inputs`),
    `$ACTOR_RUN_OUT` (fetched back) and `$ACTOR_RUN_PROGRESS` set, plus `env`. Exit 0 is success; any
    other exit is the job's own failure (`job_failed`, not retried) unless the job's verdict says
    `retriable` or `oom` (protocols/verdict.py). `code` and `inputs` are paths on this computer: a
    relative one is made absolute as the Job is made, from the caller's current folder (as the command
    line takes `--code`; `Batch` makes a batch file's absolute from the file's folder). `clouds` holds
    `[clouds.<name>]` tables, merged over the user's settings. `key` (`name/seed-<seed>`) names the
    job in the Runner, the ledger and the events."""

    name: str
    command: str
    seed: int
    code: str | None = None
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_s: float = 3600.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    max_usd: float | None = None
    policy: PolicySpec = msgspec.field(default_factory=PolicySpec)
    candidates: list[CandidateSpec] = msgspec.field(default_factory=lambda: [CandidateSpec()])
    clouds: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    public_env: list[str] = msgspec.field(default_factory=list)  # kept for older batches: plain is plain already
    secret_env: list[str] = msgspec.field(default_factory=list)  # secrets besides names that look secret

    def __post_init__(self) -> None:
        """`code` and `inputs` relative to the current folder made absolute, and a `secret_env` name
        that `env` lacks taken from this process's environment (the caller's thread; a worker
        decoding the job from the ledger finds it masked there, and fills it from its own)."""
        missing = [k for k in self.secret_env if k not in self.env and k in os.environ]
        if missing:
            msgspec.structs.force_setattr(self, "env", {**self.env, **{k: os.environ[k] for k in missing}})
        if self.code is not None and self.code and not os.path.isabs(self.code):
            msgspec.structs.force_setattr(self, "code", os.path.abspath(os.path.expanduser(self.code)))
        if any(not os.path.isabs(p) for p in self.inputs.values()):
            msgspec.structs.force_setattr(self, "inputs", {
                k: p if os.path.isabs(p) else os.path.abspath(os.path.expanduser(p)) for k, p in self.inputs.items()})

    @property
    def key(self) -> str:
        return job_key(self.name, self.seed)


def job_key(name: str, seed: int) -> str:
    """How a job (one seed of a batch) is named in the ledger, the Runner and the view."""
    return f"{name}/seed-{seed}"
