"""A Runner's clouds and its checks of a job before anything starts (objects the Runner holds; they
hold nothing of it).

`Clouds` is the set of cloud objects this Runner's leases use, each built once per settings by the
one factory (config.build_cloud): the user's settings with the job's table over them, every account
of a cloud (so that sweeps list them all). `JobChecks` checks a job: its own fields, its policy, its
candidates' clouds, the GPU and region names each cloud knows, each cloud's own check. A failed
check raises SpecError naming the field; nothing has started.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from actor_run.actors import Reactor
from actor_run.protocols.clouds import (
    MAIN,
    Checking,
    Cloud,
    LaunchChecking,
    Reclaiming,
    accounts_of,
    check_cloud_names,
    cloud_key,
    known_gpus,
    known_regions,
)
from actor_run.protocols.failures import SpecError
from actor_run.protocols.logs import logger
from actor_run.protocols.specs import (
    CandidateSpec,
    Job,
    check_candidate_names,
    check_job,
    check_policy,
    without_secrets,
)
from actor_run.supervisors.api.config import UserConfig, build_cloud, settings_digest
from actor_run.supervisors.ledger import Ledger, team
from actor_run.supervisors.ledger.sweep import reclaimable


class Clouds:
    """The clouds a Runner leases from, by cloud key, each with the digest of the settings it was
    built from. A cloud is its settings: a second job that wants the same cloud with other settings
    is refused (SpecError). `on_new(clouds, digests)` is called (outside the lock) for each cloud
    built here, before it is used: the Runner's start-up sweep of it."""

    def __init__(self, *, config: UserConfig, state_dir: Path, ledger_path: str | Path, owner: str,
                 sweep_grace_s: float) -> None:
        self.config = config
        self.state_dir = state_dir
        self.ledger_path = ledger_path
        self.owner = owner
        self.sweep_grace_s = sweep_grace_s
        self.ledger: Ledger | None = None  # set by the Runner's open: what each cloud's table is recorded in
        self.by_key: dict[str, Cloud] = {}
        self.digests: dict[str, bytes] = {}  # cloud key -> the digest of the settings its object was built from
        self.swept: set[tuple[str, bytes]] = set()  # (cloud key, settings digest) a sweep of this Runner listed
        self.on_new: Callable[[dict[str, Cloud], dict[str, bytes]], None] | None = None
        self._lock = threading.Lock()

    def get(self, name: str, table: dict[str, Any]) -> Cloud:
        """The cloud `name` for a job whose `[clouds.<name>]` table is `table`: built once per settings.
        The ledger keeps only the job's table, without its secrets."""
        digest = settings_digest(name, self.config.cloud_settings(name, table))
        with self._lock:
            have = self.by_key.get(name)
            if have is not None:
                if self.digests.get(name) == digest:
                    return have
                cloud_name = name.partition("@")[0]
                raise SpecError(f"clouds.{cloud_name}", f"differs from the [clouds.{cloud_name}] another job of this "
                                                        "Runner leases with; run it in a Runner of its own")
            cloud, digest = build_cloud(name, table, self.config, self.state_dir)
            if isinstance(cloud, LaunchChecking):  # a rented cloud's ssh_key, before a start
                cloud.check_launchable()
            if isinstance(cloud, Reclaiming):  # a quota refusal may free our idle leftovers first
                cloud.reclaim = functools.partial(reclaimable, ledger_path=self.ledger_path,
                                                  grace_s=self.sweep_grace_s, keep_owner=self.owner)
            self.by_key[name], self.digests[name] = cloud, digest
            if self.ledger is not None:
                self.ledger.record_cloud(name, without_secrets(table))
        if self.on_new is not None and (name, digest) not in self.swept:
            self.on_new({name: cloud}, {name: digest})
        return cloud


    def look_at(self, job: Job, seen: list[tuple[str, dict[str, Any], str, bool]]) -> tuple[list[str], dict[str, str]]:
        """For a job claimed from a shared ledger: build the clouds it names, each cloud's settings
        looked at once a claim (`seen`, the claim's). What to warn of (another run's settings for a
        cloud built here: it leases with this worker's), and why each cloud that cannot be built here
        at all cannot (this worker lacks its key or its settings)."""
        differs: list[str] = []
        unusable: dict[str, str] = {}
        for c in job.candidates:
            table = job.clouds.get(c.cloud, {})
            found = next(((why, ok) for name, t, why, ok in seen if name == c.cloud and t == table), None)
            if found is None:
                try:
                    self.get(c.cloud, table)
                    found = ("", True)
                except SpecError as exc:
                    found = (str(exc), c.cloud in self.by_key)  # built with other settings: it leases with ours
                seen.append((c.cloud, table, *found))
            why, ok = found
            if not ok:
                unusable[c.cloud] = why
            elif why:
                differs.append(why)
        return differs, unusable


class JobChecks:
    """`check(job)`: raise SpecError (naming the field) for a job that cannot run; builds the
    clouds it names (`Clouds.get`), runs each cloud's own check once (on the reactor)."""

    def __init__(self, clouds: Clouds, reactor: Reactor) -> None:
        self.clouds = clouds
        self.reactor = reactor
        self._checked: set[str] = set()  # cloud keys whose own check (e.g. a Lambda file system) passed
        # the policy, candidates and cloud settings (encoded) of the last job whose check passed: the
        # seeds of a batch share them, and checking them again was most of a submit (item 57)
        self._checked_shape: tuple[Any, ...] | None = None

    def check(self, job: Job) -> None:
        """Raise SpecError (naming the field) for a job that cannot run; nothing is started."""
        check_job(job, Path("/"))
        shape = _shape(job)
        if shape is not None and shape == self._checked_shape:
            return  # the same policy, places and cloud settings as the job checked before: they pass
        check_policy(job.policy)
        config = self.clouds.config
        self._check_team_budget(job, config)
        check_cloud_names(job.candidates, job.clouds)
        for i, c in enumerate(job.candidates):
            raw = job.clouds.get(c.cloud, {})
            known = accounts_of(config.cloud_settings(c.cloud, raw))  # the user's accounts too
            for account in c.accounts:
                if account != MAIN and account not in known:
                    listed = ", ".join([MAIN, *known[1:]])
                    raise SpecError(f"candidates[{i}].accounts",
                                    f"{c.cloud} has no account {account!r} (known: {listed})")
            used = {a if a != MAIN else "" for a in c.accounts} or {""}
            for account in known:  # every account, used or not, so that sweeps list them all
                try:
                    self.clouds.get(cloud_key(c.cloud, account), raw)
                except SpecError:
                    if account in used:
                        raise  # one this job walks: it cannot run without it
                    logger.warning("{}: not usable here (its sweeps skip it)", cloud_key(c.cloud, account))
        self._check_names(job)
        self._checked_shape = shape

    def check_settings(self) -> None:
        """Raise SpecError for the user config's team `budget` when the ledger does not have it."""
        config = self.clouds.config
        self._check_budget_name(config.budget, f"budget (in {config.source})")

    def _check_team_budget(self, job: Job, config: UserConfig) -> None:
        """The team budget the job draws on (its policy's, else the user config's) is in the ledger."""
        if job.policy.budget is not None:
            self._check_budget_name(job.policy.budget, "policy.budget")
        else:
            self._check_budget_name(config.budget, f"budget (in {config.source})")

    def _check_budget_name(self, name: str | None, field: str) -> None:
        if name and team.find(self.clouds.ledger_path, name) is None:
            raise SpecError(field, f"no team budget {name!r} in the ledger (actor-run budget set {name} --usd N "
                                   "--per month|week|total)")

    def _check_names(self, job: Job) -> None:
        """GPU and region names each candidate's cloud knows, and each cloud's own check (a Lambda
        file system that exists): a typo is exit 2 before anything starts."""
        by_key = self.clouds.by_key

        def cloud_of(c: CandidateSpec) -> Cloud:
            return by_key[cloud_key(c.cloud, c.accounts[0] if c.accounts else "")]

        check_candidate_names(job.candidates, lambda _i, c: known_gpus(cloud_of(c)),
                              lambda _i, c: known_regions(cloud_of(c)))
        for c in job.candidates:
            key = cloud_key(c.cloud, c.accounts[0] if c.accounts else "")
            cloud = by_key[key]
            if isinstance(cloud, Checking) and key not in self._checked:
                self.reactor.call(cloud.check, timeout=120)
                self._checked.add(key)


def _shape(job: Job) -> tuple[Any, ...] | None:
    """What of `job` the Runner's check reads besides the job's own fields: its policy, its candidate
    places and its cloud settings (encoded, so a table changed in place is a new shape). None when the
    settings do not encode: checked every time."""
    try:
        clouds = msgspec.json.encode(job.clouds)
    except (TypeError, msgspec.EncodeError):
        return None
    return job.policy, tuple(job.candidates), clouds
