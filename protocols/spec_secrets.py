"""Secrets in a batch: which env values and cloud settings are secret, and a job as the ledger may
keep it (`redacted`) and as a worker fills it again (`unredacted`).

An env value is secret when its name looks secret (KEY, TOKEN, SECRET, PASSWORD, ...) or the job's
`secret_env` lists it; a cloud setting when its name does (`api_key`, `token`, `passphrase`, ...;
`..._env` names a variable, not a value). Every secret value met is registered with the redactor
(protocols/redact.py), which masks it in any text. Pure functions: any thread.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import Any

import msgspec

from actor_run.protocols.redact import REDACTED, add_secret
from actor_run.protocols.spec_types import Job

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
