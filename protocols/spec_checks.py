"""The checks of a batch's values and the ranges they must hold; every problem a `SpecError` naming
its field (`policy.concurrency: expected int >= 1, got -2`).

`spec_error` turns msgspec's decoding error into one (an unknown key with the nearest known ones);
`check_job`, `check_policy`, `check_candidates` and `check_env` check what decoding cannot (ranges,
names, sizes, paths that must exist); `check_candidate_names` checks GPU and region names against
what a cloud knows. The `MAX_*` bounds are the largest values a batch may hold (README, "The batch
file"). Pure functions: any thread. Knows no registry of clouds (tests/test_layers.py holds it).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.spec_types import CandidateSpec, Job, JobSpec, PolicySpec

NAME_RE = re.compile(r"[a-z0-9-]{1,40}")  # a job's name
# a GPU shape: H100, H100:8 (clouds/gpus.py parse_shape splits one; this checks it first)
GPU_SHAPE = re.compile(r"[^:\s][^:]*(:[1-9][0-9]{0,2})?")
CACHE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,29}")
# the policy's budgets per kind of failure (`PolicySpec.max_<kind>`), and its answers to an OOM
KIND_LIMITS = ("max_preemptions", "max_stalls", "max_unreachable", "max_launch_failures", "max_retriable",
               "max_oom_moves")
ON_OOM = ("bigger", "fail")
ON_BUDGET_FULL = ("wait", "end")
BUDGET_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # a team budget's name (`actor-run budget set NAME`)


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
    if p.budget and not re.fullmatch(BUDGET_NAME, p.budget):
        raise SpecError(f"{at}.budget", f"expected a budget name (letters, digits, . _ -) or \"\" (none), "
                        f"got {p.budget!r}")
    _check(f"{at}.on_budget_full", p.on_budget_full in ON_BUDGET_FULL, " or ".join(repr(o) for o in ON_BUDGET_FULL),
           p.on_budget_full)
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
