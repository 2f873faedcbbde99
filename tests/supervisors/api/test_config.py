"""supervisors/api/config.py: [clouds.*] tables in the user's settings file, a batch's own tables merged
over them field by field, `actor-run config show`, and a run that needs both (a real sshd)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import run_cli
from support.sshd import Sshd

from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import CandidateSpec, Job, redacted, without_secrets
from actor_run.supervisors.api.config import ENV_VAR, Shown, UserConfig, load_config, merge, show
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import LedgerReader

SECRET = "correct-horse-battery"


def cli(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli([*args], timeout=120, cwd=tmp,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


def test_merge_is_field_by_field_at_every_depth() -> None:
    user = {"hosts": {"a": {"address": "10.0.0.1", "port": 22, "key": "k"}, "b": {"address": "10.0.0.2"}},
            "known_hosts": "/u", "regions": [1, 2]}
    batch = {"hosts": {"a": {"port": 2222}}, "regions": [3]}
    assert merge(user, batch) == {
        "hosts": {"a": {"address": "10.0.0.1", "port": 2222, "key": "k"}, "b": {"address": "10.0.0.2"}},
        "known_hosts": "/u", "regions": [3],  # a list is a value: replaced whole
    }
    assert user["hosts"]["a"]["port"] == 22  # neither input is changed


def test_the_ledgers_copy_of_a_job_keeps_no_cloud_secret() -> None:
    job = Job(name="j", command="true", seed=1, clouds={"ssh": {"known_hosts": "/k", "hosts": {
        "box": {"address": "h", "key": "~/.ssh/id", "passphrase": SECRET}}}})
    kept = redacted(job).clouds
    assert kept == {"ssh": {"known_hosts": "/k", "hosts": {"box": {"address": "h", "key": "~/.ssh/id"}}}}
    assert job.clouds["ssh"]["hosts"]["box"]["passphrase"] == SECRET  # the job itself is unchanged


def test_which_file_and_what_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(SpecError, match=f"config: no such file: {missing}"):
        load_config(missing)
    with pytest.raises(SpecError, match="no such file"):
        load_config(None, {ENV_VAR: str(missing)})
    assert load_config(None, {}).clouds == {}  # the default file may be absent (the tests' is)
    bad = tmp_path / "bad.toml"
    bad.write_text("[job]\nname = 'x'\n")
    with pytest.raises(SpecError, match=r"^job: unknown key \(in .*bad.toml\)"):
        load_config(bad)
    bad.write_text("[clouds.nimbus]\nx = 1\n")
    with pytest.raises(SpecError, match=r"clouds.nimbus: unknown cloud \(in .*bad.toml\)"):
        load_config(bad)
    bad.write_text("[clouds.ssh.hosts.box]\naddress = 'h'\nport = 0\n")
    with pytest.raises(SpecError, match=r"clouds.ssh.hosts.box.port: .*>= 1.* \(set in user config .*bad.toml\)"):
        load_config(bad)
    env = {ENV_VAR: str(bad)}
    done = cli(tmp_path, "config", "show", env=env)  # the environment names the file
    assert done.returncode == 2
    assert done.stderr.startswith("actor-run: clouds.ssh.hosts.box.port:")
    assert len(done.stderr.splitlines()) == 1


def _encrypted_key(sshd: Sshd, tmp: Path) -> Path:
    key = tmp / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", SECRET, "-C", "locked", "-f", str(key)], check=True,
                   timeout=30)
    with sshd.authorized_keys.open("a") as f:
        f.write(key.with_name(key.name + ".pub").read_text())
    return key


def test_user_config_and_a_batch_that_overrides_one_field(sshd: Sshd, tmp_path: Path) -> None:
    key = _encrypted_key(sshd, tmp_path)
    user = tmp_path / "user.toml"
    user.write_text(f"""
[clouds.ssh]
known_hosts = "{tmp_path / 'known_hosts'}"

[clouds.ssh.hosts.box]
address = "{sshd.address}"
port = {sshd.port}
user = "{sshd.user}"
key = "{key}"
passphrase = "{SECRET}"
root = "{tmp_path / 'user-root'}"
""")
    batch = tmp_path / "b.toml"
    batch.write_text(f"""
[job]
name = "cfg"
command = "echo from-the-box > $ACTOR_RUN_OUT/r.txt"
seeds = [1]
timeout_s = 60

[policy]
max_attempts = 1
poll_s = 0.2

[[candidates]]
cloud = "ssh"
hosts = ["box"]

[clouds.ssh.hosts.box]
root = "{tmp_path / 'batch-root'}"
""")
    shown = cli(tmp_path, "config", "show", str(batch), "--json", "--config", str(user))
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    rows = {r["key"]: r for r in doc["settings"]}
    assert doc["config"] == str(user)
    assert rows["clouds.ssh.hosts.box.root"] == {
        "key": "clouds.ssh.hosts.box.root", "value": str(tmp_path / "batch-root"), "source": f"batch {batch}"}
    assert rows["clouds.ssh.hosts.box.port"]["value"] == sshd.port
    assert rows["clouds.ssh.hosts.box.port"]["source"] == f"user config {user}"
    assert rows["clouds.ssh.hosts.box.passphrase"] == {
        "key": "clouds.ssh.hosts.box.passphrase", "value": "********", "source": f"user config {user}"}
    assert rows["clouds.ssh.hosts.box.slots"] == {"key": "clouds.ssh.hosts.box.slots", "value": 1, "source": "default"}
    text = cli(tmp_path, "--config", str(user), "config", "show", str(batch))  # --config before the command too
    assert text.returncode == 0, text.stderr
    assert SECRET not in shown.stdout + text.stdout
    line = next(x for x in text.stdout.splitlines() if x.startswith("clouds.ssh.hosts.box.root"))
    assert line.endswith(f"# batch {batch}")

    # the run: the key opens only with the user's passphrase; the machine's root is the batch's
    ledger = tmp_path / "ledger.sqlite"
    run = cli(tmp_path, "run", str(batch), "--json", "--state-dir", str(tmp_path / "state"), "--ledger", str(ledger),
              "--out", str(tmp_path / "out"), env={ENV_VAR: str(user)})
    assert run.returncode == 0, run.stderr + run.stdout
    assert (tmp_path / "out" / "latest" / "cfg" / "seed-1" / "out" / "r.txt").read_text() == "from-the-box\n"
    assert (tmp_path / "batch-root").is_dir()
    assert not (tmp_path / "user-root").exists()
    assert SECRET not in run.stdout + run.stderr
    reader = LedgerReader(ledger)
    try:
        recorded = dict(reader.clouds())
    finally:
        reader.close()
    assert recorded["ssh"] == {"hosts": {"box": {"root": str(tmp_path / "batch-root")}}}  # the batch's table only
    assert SECRET.encode() not in ledger.read_bytes()

    # a sweep builds the clouds the ledger names with the same merge: with the user's settings the
    # ssh cloud is listed (over the locked key); without them it cannot be built and is passed over
    for config, built in ((UserConfig(), False), (load_config(user), True)):
        runner = Runner(ledger=ledger, state_dir=tmp_path / "state", sweep_on_start=False, config=config)
        with runner:
            actions = runner.sweep(dry_run=True)
            assert ("ssh" in runner.swept_clouds) is built
            assert "ssh" not in runner.clouds  # built for the sweep only: leases never use it
        assert [a for a in actions if a.action != "keep"] == []

    # without the user config the batch alone names no address: refused before anything starts
    alone = cli(tmp_path, "run", str(batch), "--state-dir", str(tmp_path / "state"), "--ledger", str(ledger),
                "--out", str(tmp_path / "out2"))
    assert alone.returncode == 2
    assert alone.stderr.splitlines()[-1] == "actor-run: clouds.ssh.hosts.box.address: required, missing"
    # the sweep at the start said why it could not look at the ssh machines the ledger knows of
    assert "sweep: cloud ssh cannot be built (clouds.ssh.hosts.box.address: required, missing)" in alone.stderr


def test_accounts_may_live_in_the_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_TEAM_B_KEY", "not-a-real-key")
    user = UserConfig(path=str(tmp_path / "user.toml"), clouds={"sim": {
        "state_dir": str(tmp_path / "sim"), "accounts": {"team-b": {"api_key_env": "SIM_TEAM_B_KEY", "seed": 3}}}})
    batch = {"sim": {"seed": 1, "launch_latency_s": 0.0}}
    rows = {r.key: r for r in show(user, batch, "batch b.toml")}
    # an account's own value, and what it inherits from the cloud's (the batch's here)
    assert rows["clouds.sim.accounts.team-b.seed"] == Shown(
        key="clouds.sim.accounts.team-b.seed", value=3, source=f"user config {tmp_path / 'user.toml'}")
    assert rows["clouds.sim.accounts.team-b.launch_latency_s"].source == "batch b.toml"
    assert rows["clouds.sim.seed"].value == 1
    # the variable's name is no secret: shown, and kept in the ledger's copy
    assert rows["clouds.sim.accounts.team-b.api_key_env"].value == "SIM_TEAM_B_KEY"
    assert without_secrets({"api_key_env": "X", "api_key": "k"}) == {"api_key_env": "X"}
    job = Job(name="acct", command="true", seed=1, clouds=batch,
              candidates=[CandidateSpec(cloud="sim", accounts=["team-b"])])
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state", config=user) as runner:
        runner.check(job)  # the account the job walks is the user's
        assert {"sim", "sim@team-b"} <= set(runner.clouds)
