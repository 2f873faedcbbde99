"""What users write: a batch file (TOML) with a job, a retry policy, candidate places and cloud settings.

`load_batch(path)` (also `Batch.load`) decodes it with msgspec (unknown keys refused), checks every
value and resolves paths relative to the file; a problem raises `SpecError` naming the field
(`policy.concurrency: expected int >= 1, got -2`). `Batch.build(...)` makes the same thing in code.
`Job` is one seed of a batch: what the Runner runs. The public names (`actor_run.Policy`,
`actor_run.Candidate`) of `PolicySpec` and `CandidateSpec` are in actor_run/__init__.py.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import CacheSpec
from actor_run.protocols.redact import REDACTED, add_secret

NAME_RE = re.compile(r"[a-z0-9-]{1,40}")
GPU_SHAPE = re.compile(r"[^:\s][^:]*(:[1-9][0-9]{0,2})?")  # H100, H100:8 (clouds/gpus.py parse_shape reads it)
CACHE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,29}")


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
    budget: str | None = None  # a team budget across runs it draws on too (`actor-run budget set`)
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


KIND_LIMITS = ("max_preemptions", "max_stalls", "max_unreachable", "max_launch_failures", "max_retriable",
               "max_oom_moves")
ON_OOM = ("bigger", "fail")


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


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """A checked batch: one job template, its seeds, a policy, candidates and cloud tables.

    Made by `Batch.load(path)` from a TOML batch file or by `Batch.build(...)` in code; both check
    every value (a `SpecError` names the field) and make `code` and `inputs` absolute. `jobs()` gives
    one `Job` per seed, in the order of `seeds`, for `Runner.submit`."""

    spec: BatchFile
    base: str  # the folder the batch file is in (or the folder `build` resolved paths against)

    @classmethod
    def load(cls, path: str | Path) -> Batch:
        """Read and check a batch file; see `load_batch`. Its cloud names are checked where clouds
        are built (`Runner.check`, protocols/clouds: this module knows no registry of clouds)."""
        return load_batch(path)

    @classmethod
    def build(cls, *, name: str, command: str, seeds: list[int], code: str | Path | None = None,
              inputs: dict[str, str | Path] | None = None, timeout_s: float = 3600.0,
              env: dict[str, str] | None = None, policy: PolicySpec | None = None,
              candidates: list[CandidateSpec] | None = None, clouds: dict[str, dict[str, Any]] | None = None,
              base: str | Path = ".", public_env: list[str] | None = None,
              secret_env: list[str] | None = None) -> Batch:
        """A batch made in code, checked like a batch file (its cloud names where clouds are built);
        relative paths are taken from `base`."""
        job = JobSpec(name=name, command=command, seeds=list(seeds), code=None if code is None else str(code),
                      inputs={k: str(v) for k, v in (inputs or {}).items()}, timeout_s=timeout_s, env=dict(env or {}),
                      public_env=list(public_env or []), secret_env=list(secret_env or []))
        spec = BatchFile(job=job, policy=policy or PolicySpec(), candidates=list(candidates or []),
                         clouds=dict(clouds or {}))
        return _checked(spec, Path(base).expanduser().resolve(), None)

    @property
    def policy(self) -> PolicySpec:
        return self.spec.policy

    def jobs(self) -> list[Job]:
        j, p = self.spec.job, self.spec.policy
        return [
            Job(
                name=j.name, command=j.command, seed=seed, code=j.code, inputs=dict(j.inputs),
                timeout_s=j.timeout_s, env=dict(j.env), max_usd=j.max_usd, policy=p,
                candidates=list(self.spec.candidates) or [CandidateSpec()], clouds=self.spec.clouds,
                public_env=list(j.public_env), secret_env=list(j.secret_env),
            )
            for seed in j.seeds
        ]


SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|(?:^|_)PAT(?:_|$))", re.IGNORECASE)


# a cloud setting holding a secret (an API key, a key's passphrase); `key` alone is a key's path,
# and a name ending in `_env` (`api_key_env`) names the environment variable that holds one
SECRET_SETTING = re.compile(r"(api_?key|token|secret|passw|passphrase|credential|auth|access_key|private_key)",
                            re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def is_secret_setting(name: str) -> bool:
    """Cached: a job's every cloud setting is asked at each submit (10,000 jobs of one batch ask the
    same few dozen names: the search was a sixth of the submitting thread's time)."""
    return bool(SECRET_SETTING.search(name)) and not name.lower().endswith("_env")


def add_secret_settings(table: dict[str, Any]) -> None:
    """Register the values of settings whose names look secret, at any depth, with the redactor."""
    for k, v in table.items():
        if isinstance(v, dict):
            add_secret_settings(v)
        elif isinstance(v, str) and is_secret_setting(k):
            add_secret(v)


def without_secrets(table: dict[str, Any]) -> dict[str, Any]:
    """A `[clouds.<name>]` table as the ledger may keep it: settings whose names look secret are
    left out, at any depth (a resume merges the user's settings again, which supply them)."""
    return {k: without_secrets(v) if isinstance(v, dict) else v for k, v in table.items()
            if not is_secret_setting(k)}


def is_secret_env(name: str, secret_env: Collection[str]) -> bool:
    """Whether an env value is a secret: its name looks secret (KEY, TOKEN, SECRET, PASSWORD,
    CREDENTIAL, AUTH) or `secret_env` lists it."""
    return name in secret_env or bool(SECRET_NAME.search(name))


def redacted(job: Job) -> Job:
    """The job as the ledger may keep it: plain env values as they are, secret ones (`is_secret_env`)
    replaced (a `secret_env` name the job lacks too: whoever runs it takes it from its own
    environment), cloud settings whose names look secret left out."""
    env = {k: (REDACTED if is_secret_env(k, job.secret_env) else v) for k, v in job.env.items()}
    env.update({k: REDACTED for k in job.secret_env if k not in env})
    add_secret(*(v for k, v in job.env.items() if env[k] == REDACTED))  # and masked in any text
    clouds = {name: without_secrets(table) for name, table in job.clouds.items()}
    return msgspec.structs.replace(job, env=env, clouds=clouds)


def unredacted(job: Job, environ: dict[str, str]) -> tuple[Job, list[str]]:
    """Fill redacted env values from `environ` (registered with the redactor); the names still
    missing are returned."""
    if REDACTED not in job.env.values():
        return job, []  # nothing to fill: the job as it is (a replace checks the whole job again)
    env, missing = {}, []
    for k, v in job.env.items():
        if v == REDACTED:
            if k in environ:
                v = environ[k]
                add_secret(v)
            else:
                missing.append(k)
        env[k] = v
    return msgspec.structs.replace(job, env=env), missing


def _where(path: str) -> str:
    # msgspec says "... - at `$.policy.concurrency`" or "`$.candidates[0].cloud`"
    return path.removeprefix("$").removeprefix(".")


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<at>[^`]*)`)?$")


def _keys_at(root: Any, path: str) -> list[str]:
    """The keys the table at `path` (`policy`, `candidates[0]`, ...) of the struct type `root` takes."""
    import msgspec.inspect as mi

    info: Any = mi.type_info(root)
    for part in [p for p in re.split(r"\.|\[\d+\]", path) if p]:
        while isinstance(info, mi.ListType | mi.UnionType):
            info = info.item_type if isinstance(info, mi.ListType) else next(
                (t for t in info.types if isinstance(t, mi.StructType | mi.ListType)), None)
        if not isinstance(info, mi.StructType):
            return []
        info = next((f.type for f in info.fields if f.encode_name == part), None)
    while isinstance(info, mi.ListType | mi.UnionType):
        info = info.item_type if isinstance(info, mi.ListType) else next(
            (t for t in info.types if isinstance(t, mi.StructType | mi.ListType)), None)
    return [f.encode_name for f in info.fields] if isinstance(info, mi.StructType) else []


def unknown_key(field: str, key: str, known: Collection[str]) -> SpecError:
    """An unknown key, with the nearest known ones ("did you mean ...?")."""
    close = nearest_names(key, known)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SpecError(field, "unknown key" + hint)


def spec_error(exc: msgspec.ValidationError, prefix: str = "", root: Any = None) -> SpecError:
    """msgspec's "Expected `int`, got `str` - at `$.policy.concurrency`" as a SpecError naming the
    field (`prefix.policy.concurrency: expected int, got str`); an unknown key of the struct type
    `root` (when given) with the nearest known keys."""
    m = _AT.match(str(exc))
    assert m is not None
    msg, at = m.group("msg"), _where(m.group("at") or "")
    at = ".".join(p for p in (prefix, at) if p)
    unknown = re.match(r"Object contains unknown field `([^`]+)`", msg)
    if unknown:
        field = f"{at}.{unknown.group(1)}" if at else unknown.group(1)
        if unknown.group(1) == "gpu_count":
            return SpecError(field, 'unknown key (the count goes in gpu: gpu = "H100:8")')
        known = _keys_at(root, _where(m.group("at") or "")) if root is not None else []
        return unknown_key(field, unknown.group(1), known)
    missing = re.match(r"Object missing required field `([^`]+)`", msg)
    if missing:
        field = f"{at}.{missing.group(1)}" if at else missing.group(1)
        return SpecError(field, "required, missing")
    return SpecError(at, msg.replace("`", "").replace("Expected", "expected"))


def _check(field: str, ok: bool, want: str, got: object) -> None:
    if not ok:
        raise SpecError(field, f"expected {want}, got {got!r}")


# the largest values a batch may hold (README, "The batch file"): a seed fits a signed 64-bit ledger
# column and a machine's name; seconds and dollars stay numbers a deadline, a name and a bill can hold
# (timeout_s = 1e308 made 300-digit machine names); counts stay counts a process can keep
MAX_SEED = 2**63 - 1  # |seed| <= MAX_SEED
MAX_SECONDS = 31_622_400.0  # 366 days: any duration (timeout_s, setup_grace_s, backoff_s, ...)
MAX_USD = 10_000_000.0  # any amount of dollars (budget_usd, max_usd, max_hourly_usd)
MAX_ATTEMPTS = 10_000
MAX_CONCURRENCY = 1_000_000
MAX_COUNT = 1_000_000  # any other count (thrash_max)
MAX_FACTOR = 100.0  # last_grace_factor


def _number(field: str, value: float, least: float, strict: bool, most: float = MAX_SECONDS) -> None:
    """A finite number above (`strict`) or at least `least`, at most `most`: inf and nan are refused
    everywhere."""
    _check(field, math.isfinite(value), "a finite number", value)
    _check(field, value > least if strict else value >= least, f"number {'>' if strict else '>='} {least:g}", value)
    _check(field, value <= most, f"number <= {most:,.0f}", value)


def _count(field: str, value: int, least: int, most: int) -> None:
    _check(field, value >= least, f"int >= {least}", value)
    _check(field, value <= most, f"int <= {most:,}", value)


# what may not be in a name that becomes part of an id, a path or a machine's name: a path separator
# (ids are split on `/`), a control character (it would reach a terminal or a shell raw) or a space
_BAD_NAME = re.compile(r"[/\\\x00-\x20\x7f-\x9f]")


def check_name_part(field: str, value: str) -> None:
    """SpecError naming `field` unless `value` is a non-empty name without a path separator, a space
    or a control character (an ssh host `gpu/1` took a slot never freed: ids are split on `/`)."""
    bad = _BAD_NAME.search(value)
    if not value or bad is not None:
        what = "an empty name" if not value else f"{bad.group()!r} in {value!r}" if bad else value
        raise SpecError(field, f"expected a name without '/', spaces or control characters, got {what}")


def _control_free(field: str, value: str) -> None:
    _no_nul(field, value)
    bad = re.search(r"[\x00-\x1f\x7f-\x9f]", value)
    if bad is not None:
        raise SpecError(field, f"contains the control character {bad.group()!r}")


def check_seed(field: str, seed: int) -> None:
    _check(field, -MAX_SEED <= seed <= MAX_SEED, "a seed within 63 bits (|seed| < 2**63)", seed)


def _no_nul(field: str, text: str) -> None:
    if "\0" in text:
        raise SpecError(field, "contains a NUL byte")


# an exec's single argument or environment string is at most 128 KiB on Linux (MAX_ARG_STRLEN,
# with its NUL); macOS holds all arguments and the environment to 1 MiB together
MAX_ENV_ENTRY = (128 << 10) - 1
MAX_ENV_TOTAL = 256 << 10


LOG_MAX_MB_MOST = 1 << 20  # a terabyte of log per attempt: more is a mistake


def check_policy(p: PolicySpec, at: str = "policy") -> None:
    _count(f"{at}.max_attempts", p.max_attempts, 1, MAX_ATTEMPTS)
    _count(f"{at}.concurrency", p.concurrency, 1, MAX_CONCURRENCY)
    if p.budget_usd is not None:
        _number(f"{at}.budget_usd", p.budget_usd, 0, strict=True, most=MAX_USD)
    if p.budget is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", p.budget):
        raise SpecError(f"{at}.budget", f"expected a budget name (letters, digits, . _ -), got {p.budget!r}")
    for name in ("setup_grace_s", "stall_after_s", "lost_after_s", "poll_s", "thrash_window_s"):
        _number(f"{at}.{name}", getattr(p, name), 0, strict=True)
    if p.capacity_wait_s is not None:
        _number(f"{at}.capacity_wait_s", p.capacity_wait_s, 0, strict=False)
    for name in ("backoff_s", "backoff_max_s", "deadline_margin_s"):
        _number(f"{at}.{name}", getattr(p, name), 0, strict=False)
    _count(f"{at}.thrash_max", p.thrash_max, 1, MAX_COUNT)
    for name in KIND_LIMITS:
        value = getattr(p, name)
        if value is not None:
            _count(f"{at}.{name}", value, 0, MAX_ATTEMPTS)
    _check(f"{at}.on_oom", p.on_oom in ON_OOM, " or ".join(repr(o) for o in ON_OOM), p.on_oom)
    for i, code in enumerate(p.retry_on_exit):
        _check(f"{at}.retry_on_exit[{i}]", 1 <= code <= 255, "an exit code from 1 to 255", code)
    _number(f"{at}.log_max_mb", p.log_max_mb, 0, strict=True)
    _check(f"{at}.log_max_mb", p.log_max_mb <= LOG_MAX_MB_MOST, f"a number <= {LOG_MAX_MB_MOST}", p.log_max_mb)
    _number(f"{at}.last_grace_factor", p.last_grace_factor, 1, strict=False, most=MAX_FACTOR)
    # a host is judged lost only after several heartbeats could have reached it
    _check(f"{at}.lost_after_s", p.lost_after_s >= 3 * p.poll_s, f"a number >= 3 x poll_s ({3 * p.poll_s:g})",
           p.lost_after_s)


def check_env(env: dict[str, str], public: list[str], at: str = "job", secret: Collection[str] = ()) -> None:
    """Names a shell can take and actor-run does not own; no NUL; sizes an exec accepts."""
    from actor_run.protocols.hosts.scripts import env_name_problem  # hosts/ imports nothing of specs

    total = 0
    for name, value in env.items():
        problem = env_name_problem(name)
        if problem is not None:
            raise SpecError(f"{at}.env", problem)
        _no_nul(f"{at}.env.{name}", value)
        size = len(name.encode()) + 1 + len(value.encode())
        _check(f"{at}.env.{name}", size <= MAX_ENV_ENTRY, f"NAME=value of at most {MAX_ENV_ENTRY} bytes",
               f"{size} bytes")
        total += size + 1
    _check(f"{at}.env", total <= MAX_ENV_TOTAL, f"at most {MAX_ENV_TOTAL} bytes in all", f"{total} bytes")
    for name in public:
        if name not in env:
            raise SpecError(f"{at}.public_env", f"{name!r} is not a name in {at}.env")
    for name in secret:
        problem = env_name_problem(name)
        if problem is not None:
            raise SpecError(f"{at}.secret_env", problem)


def check_job(job: Job | JobSpec, base: Path, at: str = "job") -> None:
    _check(f"{at}.name", bool(NAME_RE.fullmatch(job.name)), "[a-z0-9-], 1 to 40 characters", job.name)
    _check(f"{at}.command", bool(job.command.strip()), "a command", job.command)
    _no_nul(f"{at}.command", job.command)
    _number(f"{at}.timeout_s", job.timeout_s, 0, strict=True)
    if job.max_usd is not None:
        _number(f"{at}.max_usd", job.max_usd, 0, strict=True, most=MAX_USD)
    if isinstance(job, Job):
        check_seed(f"{at}.seed", job.seed)
    else:
        for i, seed in enumerate(job.seeds):
            check_seed(f"{at}.seeds[{i}]", seed)
    check_env(job.env, job.public_env, at, job.secret_env)
    if job.code is not None:
        code = base / job.code
        if not code.is_dir():
            raise SpecError(f"{at}.code", f"no such folder: {code}")
    for name, path in job.inputs.items():
        _no_nul(f"{at}.inputs.{name}", path)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
            raise SpecError(f"{at}.inputs", f"input name {name!r} must be [A-Za-z0-9_.-]")
        if name == "resume":
            raise SpecError(f"{at}.inputs.{name}", "the name 'resume' is reserved for checkpoints")
        if not (base / path).exists():
            raise SpecError(f"{at}.inputs.{name}", f"no such file or folder: {base / path}")


def check_candidates(candidates: list[CandidateSpec], known_clouds: set[str]) -> None:
    for i, c in enumerate(candidates):
        if c.cloud not in known_clouds:
            known = ", ".join(sorted(known_clouds))
            raise SpecError(f"candidates[{i}].cloud", f"unknown cloud {c.cloud!r} (known: {known})")
        if c.max_hourly_usd is not None:
            _number(f"candidates[{i}].max_hourly_usd", c.max_hourly_usd, 0, strict=False, most=MAX_USD)
        _control_free(f"candidates[{i}].gpu", c.gpu)
        for region in c.regions:
            _control_free(f"candidates[{i}].regions", region)
        for field in ("hosts", "accounts"):  # names in machine ids and cloud keys
            for j, name in enumerate(getattr(c, field)):
                if name or field == "hosts":  # an account "" is the cloud's own settings
                    check_name_part(f"candidates[{i}].{field}[{j}]", name)
        for field in ("gpu", "regions", "hosts", "accounts", "image"):
            value = getattr(c, field)
            for text in [value] if isinstance(value, str) else value:
                _no_nul(f"candidates[{i}].{field}", text)
        _check(f"candidates[{i}].gpu", not c.gpu or bool(GPU_SHAPE.fullmatch(c.gpu)),
               "<GPU> or <GPU>:<count> with a count of at least 1 (H100:8)", c.gpu)
        if c.cache is not None:
            _check(f"candidates[{i}].cache.name", bool(CACHE_NAME.fullmatch(c.cache.name)),
                   "[a-z0-9-], 1 to 30 characters", c.cache.name)
            _check(f"candidates[{i}].cache.size_gb", c.cache.size_gb >= 1, "int >= 1", c.cache.size_gb)
            _check(f"candidates[{i}].cache.mount", c.cache.mount.startswith("/") and ".." not in c.cache.mount
                   and bool(re.fullmatch(r"[A-Za-z0-9_./-]+", c.cache.mount)), "an absolute path", c.cache.mount)


def nearest_names(value: str, known: Collection[str], n: int = 3) -> list[str]:
    """The known names closest to `value` (difflib, case folded), closest first."""
    folded = {k.lower(): k for k in known}
    return [folded[m] for m in difflib.get_close_matches(value.lower(), list(folded), n=n, cutoff=0.5)]


def check_known_name(field: str, what: str, value: str, known: Collection[str], *, fold: bool = False) -> None:
    """SpecError naming `field` when `value` is not one of `known` (`fold`: without regard to
    case), suggesting the nearest known names."""
    if value in known or (fold and value.lower() in {k.lower() for k in known}):
        return
    close = nearest_names(value, known)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else \
        f"known: {', '.join(sorted(known)[:12])}{', ...' if len(known) > 12 else ''}"
    raise SpecError(field, f"unknown {what} {value!r} ({hint})")


def check_candidate_names(candidates: list[CandidateSpec],
                          gpus_of: Callable[[int, CandidateSpec], Collection[str] | None],
                          regions_of: Callable[[int, CandidateSpec], Collection[str] | None]) -> None:
    """Every candidate's `gpu` and `regions` among the names its cloud knows (None: the cloud does
    not say, so nothing is checked): a typo is bad input before anything starts, not a walk that
    finds no stock anywhere."""
    for i, c in enumerate(candidates):
        gpus = gpus_of(i, c)
        gpu = c.gpu.partition(":")[0]  # a shape's class; its count was checked with the candidate
        if gpu and gpus is not None and not gpus:
            raise SpecError(f"candidates[{i}].gpu", f"{c.cloud} has no GPU {c.gpu!r}" + (
                " (this computer claims none: name its GPUs with gpus = [...] under [clouds.local] in your settings,"
                " or pass --cloud with a cloud that sells it)" if c.cloud == "local" else ""))
        if gpu and gpus is not None:
            check_known_name(f"candidates[{i}].gpu", f"GPU for {c.cloud}", gpu, gpus, fold=True)
        regions = regions_of(i, c)
        if regions is not None:
            for j, region in enumerate(c.regions):
                check_known_name(f"candidates[{i}].regions[{j}]", f"region for {c.cloud}", region, regions)


def load_batch(path: str | Path, known_clouds: set[str] | None = None) -> Batch:
    """Read and check a batch file; every problem is a `SpecError` naming its field. Its cloud names
    are checked against `known_clouds` when the caller gives them (the registry's are
    `protocols.clouds.known_clouds()`; this module does not know it)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError("", f"cannot read batch file {p}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError("", f"{p} is not UTF-8 text (byte {exc.start}); TOML must be") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError("", f"{p} is not valid TOML: {exc}") from exc
    try:
        spec = msgspec.convert(raw, BatchFile)
    except msgspec.ValidationError as exc:
        raise spec_error(exc, root=BatchFile) from exc
    return _checked(spec, p.resolve().parent, known_clouds)


def read_batch_table(path: str | Path) -> dict[str, Any]:
    """A batch file's TOML as a table, unchecked (the one-line run edits it before `batch_from_table`)."""
    p = Path(path).expanduser()
    try:
        return tomllib.loads(p.read_text())
    except OSError as exc:
        raise SpecError("", f"cannot read batch file {p}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SpecError("", f"{p} is not valid TOML: {exc}") from exc


def batch_from_table(raw: dict[str, Any], base: Path, known_clouds: set[str] | None = None) -> Batch:
    """A batch from a table shaped like a batch file, checked like one (relative paths from `base`)."""
    try:
        spec = msgspec.convert(raw, BatchFile)
    except msgspec.ValidationError as exc:
        raise spec_error(exc, root=BatchFile) from exc
    return _checked(spec, base, known_clouds)


def _checked(spec: BatchFile, base: Path, known_clouds: set[str] | None) -> Batch:
    """Check every value of a batch; make its paths absolute (relative ones are from `base`)."""
    if not spec.job.seeds:
        raise SpecError("job.seeds", "expected a non-empty list of ints, got []")
    if len(set(spec.job.seeds)) != len(spec.job.seeds):
        raise SpecError("job.seeds", f"seeds repeat: {spec.job.seeds}")
    check_job(spec.job, base)
    check_policy(spec.policy)
    if known_clouds is not None:
        check_candidates(spec.candidates, known_clouds)
        for name in spec.clouds:
            if name not in known_clouds:
                raise SpecError(f"clouds.{name}", f"unknown cloud (known: {', '.join(sorted(known_clouds))})")
    resolved = msgspec.structs.replace(
        spec.job,
        code=str(base / spec.job.code) if spec.job.code is not None else None,
        inputs={k: str(base / v) for k, v in spec.job.inputs.items()},
    )
    return Batch(spec=msgspec.structs.replace(spec, job=resolved), base=str(base))
