"""What users write: a batch file (TOML) with a job, a retry policy, candidate places and cloud settings.

`load_batch(path)` (also `Batch.load`) decodes it with msgspec (unknown keys refused), checks every
value and resolves paths relative to the file; a problem raises `SpecError` naming the field
(`policy.concurrency: expected int >= 1, got -2`). `Batch.build(...)` makes the same thing in code.
`Job` is one seed of a batch: what the Runner runs. The public names (`actor_run.Policy`,
`actor_run.Candidate`) of `PolicySpec` and `CandidateSpec` are in actor_run/__init__.py.

This module is the batch's front: `Batch` and the loading here, and every public name of the three
rooms behind it importable from here too (`__all__`): protocols/spec_types.py (the structs and
`Job`), protocols/spec_checks.py (the checks, the ranges, msgspec's errors as `SpecError`s) and
protocols/spec_secrets.py (secret env values and cloud settings; `redacted`, `unredacted`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.spec_checks import (
    BUDGET_NAME,
    CACHE_NAME,
    GPU_SHAPE,
    KIND_LIMITS,
    LOG_MAX_MB_MOST,
    MAX_ATTEMPTS,
    MAX_CONCURRENCY,
    MAX_COUNT,
    MAX_ENV_ENTRY,
    MAX_ENV_TOTAL,
    MAX_FACTOR,
    MAX_SECONDS,
    MAX_SEED,
    MAX_USD,
    NAME_RE,
    ON_BUDGET_FULL,
    ON_OOM,
    check_candidate_names,
    check_candidates,
    check_env,
    check_job,
    check_known_name,
    check_name_part,
    check_policy,
    check_seed,
    nearest_names,
    spec_error,
    unknown_key,
)
from actor_run.protocols.spec_secrets import (
    SECRET_NAME,
    SECRET_SETTING,
    add_secret_settings,
    is_secret_env,
    is_secret_setting,
    redacted,
    unredacted,
    without_secrets,
)
from actor_run.protocols.spec_types import BatchFile, CandidateSpec, Job, JobSpec, PolicySpec, job_key

__all__ = [
    "BUDGET_NAME",
    "CACHE_NAME",
    "GPU_SHAPE",
    "KIND_LIMITS",
    "LOG_MAX_MB_MOST",
    "MAX_ATTEMPTS",
    "MAX_CONCURRENCY",
    "MAX_COUNT",
    "MAX_ENV_ENTRY",
    "MAX_ENV_TOTAL",
    "MAX_FACTOR",
    "MAX_SECONDS",
    "MAX_SEED",
    "MAX_USD",
    "NAME_RE",
    "ON_BUDGET_FULL",
    "ON_OOM",
    "SECRET_NAME",
    "SECRET_SETTING",
    "Batch",
    "BatchFile",
    "CandidateSpec",
    "Job",
    "JobSpec",
    "PolicySpec",
    "add_secret_settings",
    "batch_from_table",
    "check_candidate_names",
    "check_candidates",
    "check_env",
    "check_job",
    "check_known_name",
    "check_name_part",
    "check_policy",
    "check_seed",
    "is_secret_env",
    "is_secret_setting",
    "job_key",
    "load_batch",
    "nearest_names",
    "read_batch_table",
    "redacted",
    "spec_error",
    "unknown_key",
    "unredacted",
    "without_secrets",
]


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
