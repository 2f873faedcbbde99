"""User settings: the `[clouds.*]` tables that belong to a user (addresses, key paths, API keys),
kept once in a file of theirs and merged under each batch's own tables.

Which file: `--config PATH`, else `$ACTOR_RUN_CONFIG`, else `config.toml` in platformdirs' user
config folder (`~/.config/actor-run/config.toml` on Linux) when it exists. A file named by the
first two must exist; the default one may be absent (no user settings).

Merging: a batch's (or a Job's) `[clouds.<name>]` table overrides the user's field by field. Tables
merge key by key at every depth (`[clouds.ssh.hosts.gpu1]` in both: each key from the batch wins,
the others stay the user's); any other value (a string, a number, a list) is replaced whole.

The merge happens where a cloud is built from its settings (`Runner`), so `run`, `resume` and
`sweep` see the same values. What the ledger keeps of a cloud's settings is the batch's own table
without its secrets (specs.without_secrets), never what came from this file.

Besides the clouds: `confirm_above_usd`, `[notify]` (notify.py), and `budget = "NAME"`, the team
budget every job draws on whose policy names none (`UserConfig.job_defaults`, applied where a job is
submitted: what the ledger records is the job as it runs).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import platformdirs

from actor_run.protocols.clouds import (
    Cloud,
    account_settings,
    accounts_of,
    cloud_key,
    known_clouds,
    make_cloud,
    parse_settings,
    split_key,
)
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import BUDGET_NAME, Job, is_secret_setting, nearest_names
from actor_run.supervisors.api.notify import NotifySettings, parse_notify

ENV_VAR = "ACTOR_RUN_CONFIG"
KEYS = ("budget", "clouds", "confirm_above_usd", "notify")  # what a user config holds at its top
MASK = "********"  # what `config show` prints for a setting whose name says it is a secret (is_secret_setting)


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir("actor-run")) / "config.toml"


class UserConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The user's settings, read and checked by `load_config` (or made in code and given to
    `Runner(config=...)`): `clouds` holds `[clouds.<name>]` tables, under which each job's own are
    merged field by field; `path` is the file they came from (None: none)."""

    path: str | None = None  # None: no file (nothing configured)
    clouds: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # `run` on a terminal asks before a batch whose worst case (`actor-run plan`) passes this; None: never asks
    confirm_above_usd: float | None = None
    notify: NotifySettings = msgspec.field(default_factory=NotifySettings)  # [notify]: webhooks (notify.py)
    # the team budget (`actor-run budget set`) every job draws on whose policy names none; a policy's
    # own `budget` wins, and `budget = ""` in it draws on none
    budget: str | None = None

    def job_defaults(self, job: Job) -> Job:
        """`job` with what these settings fill in: the team budget its policy leaves unnamed (None)."""
        if job.policy.budget is not None or not self.budget:
            return job
        return msgspec.structs.replace(job, policy=msgspec.structs.replace(job.policy, budget=self.budget))

    @property
    def source(self) -> str:
        return f"user config {self.path}" if self.path else "user config"

    def cloud_settings(self, name: str, table: dict[str, Any]) -> dict[str, Any]:
        """The cloud's settings: the user's table with `table` (the batch's) merged over it. `name`
        is a cloud or a cloud key (`sim@team-b`): the whole table, accounts and all, either way."""
        cloud, _ = split_key(name)
        return merge(self.clouds.get(cloud, {}), table)

    def parse(self, key: str, table: dict[str, Any], *, table_source: str = "batch") -> Any:
        """The settings struct of a cloud's account (`key`: `sim`, `sim@team-b`) from the merged
        table; a bad value raises SpecError naming the field and the file it came from."""
        name, account = split_key(key)
        merged = self.cloud_settings(name, table)
        try:
            return parse_settings(name, account_settings(name, merged, account))
        except SpecError as exc:
            prefix = f"clouds.{name}."
            if not exc.field.startswith(prefix):
                raise
            # msgspec names a table's key `[...]` (hosts[...].port): the keys that fit are looked up
            pattern = tuple(re.findall(r"\[[^\]]*\]|[^.\[\]]+", exc.field[len(prefix):]))
            if exc.problem.startswith("required, missing"):  # the tables that lack the key, not those that have it
                paths = [(*p, pattern[-1]) for p in _expand(pattern[:-1], merged) if pattern[-1] not in _at(merged, p)]
            else:
                paths = _expand(pattern, merged)
            field = prefix + ".".join(paths[0]) if len(paths) == 1 else exc.field
            layers = [(self.source, self.clouds.get(name, {})), (table_source, table)]
            came = [s for s in (_source_of(p, layers) for p in paths) if s]
            if not came:
                raise SpecError(field, exc.problem) from exc
            raise SpecError(field, f"{exc.problem} (set in {came[-1]})") from exc


def _at(node: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` (found by `_expand`) in `node`."""
    for part in path:
        node = node[int(part[1:-1])] if isinstance(node, list) else node[part]
    return node


def _expand(pattern: tuple[str, ...], node: Any, done: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths in `node` that fit `pattern`, whose `[...]` parts stand for any key."""
    if not pattern:
        return [done]
    head, rest = pattern[0], pattern[1:]
    if isinstance(node, dict):
        keys = list(node) if head == "[...]" else [head] if head in node else []
        return [p for k in keys for p in _expand(rest, node[k], (*done, k))]
    if isinstance(node, list) and re.fullmatch(r"\[\d+\]", head) and int(head[1:-1]) < len(node):
        return _expand(rest, node[int(head[1:-1])], (*done, head))
    return []


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: tables merge key by key at every depth, other values are replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _source_of(path: tuple[str, ...], layers: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Which layer (the last one wins) set the value at `path`, or set a table that holds it."""
    found = None
    for source, table in layers:
        if path and _expand(path, table):
            found = source
    return found


def config_path(explicit: str | Path | None = None, environ: dict[str, str] | None = None) -> tuple[Path, bool]:
    """The user's settings file and whether it must exist (it must when named on purpose)."""
    env = os.environ if environ is None else environ
    if explicit:
        return Path(explicit).expanduser(), True
    if env.get(ENV_VAR):
        return Path(env[ENV_VAR]).expanduser(), True
    return default_config_path(), False


def load_config(explicit: str | Path | None = None, environ: dict[str, str] | None = None) -> UserConfig:
    """Read and check the user's settings file (see the module docstring for which one)."""
    path, required = config_path(explicit, environ)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        if not required:
            return UserConfig()
        raise SpecError("config", f"no such file: {path}") from exc
    except OSError as exc:
        raise SpecError("config", f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError("config", f"{path} is not valid TOML: {exc}") from exc
    where = f" (in {path})"
    for key in raw:
        if key not in KEYS:
            close = nearest_names(key, KEYS)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(key, f"unknown key{where}: {hint}a user config holds budget, confirm_above_usd, "
                            "[notify] and [clouds.<name>] tables only")
    confirm = raw.get("confirm_above_usd")
    if confirm is not None and (isinstance(confirm, bool) or not isinstance(confirm, int | float) or confirm < 0):
        raise SpecError("confirm_above_usd", f"expected a number >= 0{where}, got {confirm!r}")
    budget = raw.get("budget")
    if budget is not None and not (isinstance(budget, str) and re.fullmatch(BUDGET_NAME, budget)):
        raise SpecError("budget", f"expected a team budget's name (letters, digits, . _ -){where}, got {budget!r}")
    clouds = raw.get("clouds", {})
    if not isinstance(clouds, dict):
        raise SpecError("clouds", f"expected a table{where}")
    known = known_clouds()
    for name, table in clouds.items():
        if name not in known:
            raise SpecError(f"clouds.{name}", f"unknown cloud{where} (known: {', '.join(sorted(known))})")
        if not isinstance(table, dict):
            raise SpecError(f"clouds.{name}", f"expected a table{where}")
    config = UserConfig(path=str(path.resolve()), clouds=clouds,
                        confirm_above_usd=None if confirm is None else float(confirm), budget=budget,
                        notify=parse_notify(raw.get("notify", {}), where))
    for name in clouds:
        config.parse(name, {})  # every value checked now, naming this file
    return config


def resolve_config(config: str | Path | UserConfig | None) -> UserConfig:
    """A Runner's `config` argument as settings: a UserConfig as is, else the file it names (None:
    `$ACTOR_RUN_CONFIG`, else the default file if there is one)."""
    return config if isinstance(config, UserConfig) else load_config(config)


# --- `actor-run config show` ---------------------------------------------------------------------


def masked(value: Any, key: str = "") -> Any:
    """`value` with every field whose name looks secret replaced by a mask, at any depth."""
    if key and is_secret_setting(key) and value not in (None, ""):
        return MASK
    if isinstance(value, dict):
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def leaves(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every value of a nested table that is not itself a table, with its path."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out += leaves(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


class Shown(msgspec.Struct, frozen=True, kw_only=True):
    """One setting as `config show` prints it: masked when secret, with where it came from."""

    key: str  # dotted: clouds.ssh.hosts.gpu1.port
    value: Any
    source: str  # "user config <path>", "batch <path>" or "default"


def show(config: UserConfig, batch_clouds: dict[str, dict[str, Any]] | None = None,
         batch_source: str = "batch") -> list[Shown]:
    """The merged settings of every cloud the user config or the batch names, defaults filled in,
    each with its source; secrets masked."""
    batch_clouds = batch_clouds or {}
    rows = []
    for name in sorted(set(config.clouds) | set(batch_clouds)):
        table = batch_clouds.get(name, {})
        layers = [(config.source, config.clouds.get(name, {})), (batch_source, table)]
        for account in accounts_of(config.cloud_settings(name, table)):
            full = msgspec.to_builtins(config.parse(cloud_key(name, account), table, table_source=batch_source))
            own = ("accounts", account) if account else ()
            for path, value in leaves(full):
                # an account's value is its own, or the cloud's it inherits
                source = (own and _source_of((*own, *path), layers)) or _source_of(path, layers) or "default"
                shown = masked({path[-1]: value})[path[-1]]
                rows.append(Shown(key=".".join(("clouds", name, *own, *path)), value=shown, source=source))
    return rows


def settings_digest(key: str, merged: dict[str, Any]) -> bytes:
    """What tells one cloud object from another: its key and its merged settings (account included)."""
    return key.encode() + b"\0" + msgspec.json.encode(merged, order="sorted")


def build_cloud(key: str, table: dict[str, Any], config: UserConfig, state_dir: Path) -> tuple[Cloud, bytes]:
    """The one cloud factory: the cloud `key` (`sim`, `sim@team-b`) built from the user's settings
    with `table` (a batch's `[clouds.<name>]`, or what the ledger recorded) merged over them, and the
    digest of those merged settings (a cloud is its settings: two digests, two clouds). Raises
    SpecError naming the field and its file for a bad value. Builds only: no network, no check."""
    config.parse(key, table)  # a bad value names its field and its file
    merged = config.cloud_settings(key, table)
    return make_cloud(key, merged, state_dir), settings_digest(key, merged)

