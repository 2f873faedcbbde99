"""The Runner's checks of a job before anything starts, and the clouds they build (a part of Runner, as
takeover.py and event_bus.py are): the job's own fields, its policy, its candidates' clouds built from
the user's settings with the job's table over them (each account, so sweeps list them all), the GPU and
region names each cloud knows. A failed check raises SpecError naming the field; nothing has started.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from loguru import logger

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
    make_cloud,
)
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import (
    CandidateSpec,
    Job,
    check_candidate_names,
    check_job,
    check_policy,
    without_secrets,
)
from actor_run.supervisors.api.config import UserConfig, settings_digest
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.ledger.sweep import SweepAction, reclaimable


class JobChecks:
    """Runner's `check` and `_cloud`; the attributes below are the Runner's own."""

    ledger: Ledger
    ledger_path: str | Path
    owner: str
    config: UserConfig
    clouds: dict[str, Cloud]
    _digests: dict[str, bytes]
    _swept: set[tuple[str, bytes]]
    _checked: set[str]
    _checked_shape: tuple[Any, ...] | None
    _lock: threading.Lock
    state_dir: Path
    reactor: Reactor
    sweep_on_start: bool
    sweep_grace_s: float
    swept: list[SweepAction]
    _sweep_clouds: Callable[..., list[SweepAction]]  # Takeover's

    def check(self, job: Job) -> None:
        """Raise SpecError (naming the field) for a job that cannot run; nothing is started."""
        check_job(job, Path("/"))
        shape = _shape(job)
        if shape is not None and shape == self._checked_shape:
            return  # the same policy, places and cloud settings as the job checked before: they pass
        check_policy(job.policy)
        check_cloud_names(job.candidates, job.clouds)
        for i, c in enumerate(job.candidates):
            raw = job.clouds.get(c.cloud, {})
            known = accounts_of(self.config.cloud_settings(c.cloud, raw))  # the user's accounts too
            for account in c.accounts:
                if account != MAIN and account not in known:
                    listed = ", ".join([MAIN, *known[1:]])
                    raise SpecError(f"candidates[{i}].accounts",
                                    f"{c.cloud} has no account {account!r} (known: {listed})")
            used = {a if a != MAIN else "" for a in c.accounts} or {""}
            for account in known:  # every account, used or not, so that sweeps list them all
                try:
                    self._cloud(cloud_key(c.cloud, account), raw)
                except SpecError:
                    if account in used:
                        raise  # one this job walks: it cannot run without it
                    logger.warning("{}: not usable here (its sweeps skip it)", cloud_key(c.cloud, account))
        self._check_names(job)
        self._checked_shape = shape

    def _check_names(self, job: Job) -> None:
        """GPU and region names each candidate's cloud knows, and each cloud's own check (a Lambda
        file system that exists): a typo is exit 2 before anything starts."""
        def cloud_of(c: CandidateSpec) -> Cloud:
            return self.clouds[cloud_key(c.cloud, c.accounts[0] if c.accounts else "")]

        check_candidate_names(job.candidates, lambda _i, c: known_gpus(cloud_of(c)),
                              lambda _i, c: known_regions(cloud_of(c)))
        for c in job.candidates:
            key = cloud_key(c.cloud, c.accounts[0] if c.accounts else "")
            cloud = self.clouds[key]
            if isinstance(cloud, Checking) and key not in self._checked:
                self.reactor.call(cloud.check, timeout=120)
                self._checked.add(key)

    def _cloud(self, name: str, settings: dict[str, Any]) -> Cloud:
        """The cloud `name` for a job: built from the user's settings with `settings` (the job's
        table) merged over them, once per settings. A cloud is its settings: the object leases use
        is never one built from other settings (the ledger's, another run's); a second job of this
        Runner that wants the same cloud with other settings is refused (SpecError). The ledger
        keeps only the job's table, without its secrets. A cloud new to this Runner is swept first
        (sweep_on_start): the start-up sweep sees every cloud the batch names."""
        merged = self.config.cloud_settings(name, settings)
        digest = settings_digest(name, merged)
        with self._lock:
            have = self.clouds.get(name)
            if have is not None:
                if self._digests.get(name) == digest:
                    return have
                cloud_name = name.partition("@")[0]
                raise SpecError(f"clouds.{cloud_name}", f"differs from the [clouds.{cloud_name}] another job of this "
                                                        "Runner leases with; run it in a Runner of its own")
            self.config.parse(name, settings)  # a bad value names its field and its file
            cloud = make_cloud(name, merged, self.state_dir)
            if isinstance(cloud, LaunchChecking):  # a rented cloud's ssh_key, before a start
                cloud.check_launchable()
            if isinstance(cloud, Reclaiming):  # a quota refusal may free our idle leftovers first
                cloud.reclaim = functools.partial(reclaimable, ledger_path=self.ledger_path,
                                                  grace_s=self.sweep_grace_s, keep_owner=self.owner)
            self.clouds[name], self._digests[name] = cloud, digest
            self.ledger.record_cloud(name, without_secrets(settings))
        if self.sweep_on_start and (name, digest) not in self._swept:
            self.swept += self._sweep_clouds({name: cloud}, digests={name: digest})
        return cloud


def _shape(job: Job) -> tuple[Any, ...] | None:
    """What of `job` the Runner's check reads besides the job's own fields: its policy, its candidate
    places and its cloud settings (encoded, so a table changed in place is a new shape). None when the
    settings do not encode: checked every time."""
    try:
        clouds = msgspec.json.encode(job.clouds)
    except (TypeError, msgspec.EncodeError):
        return None
    return job.policy, tuple(job.candidates), clouds
