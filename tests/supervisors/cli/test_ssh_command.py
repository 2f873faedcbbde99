"""supervisors/cli/ssh.py: `actor-run ssh JOB/SEED [-- CMD]` (issue 29.4) through the real command
line: on the ssh cloud's real sshd (a command, and an interactive shell under a pseudo-terminal), on
a rented fake's machine (a real sshd login) over the pinned host key, and in the local sandbox."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from fakes.batch_kit import env as key_env
from fakes.batch_kit import write_batch
from fakes.runpod import FakeRunPod
from support.sshd import Sshd
from support.terminal import Terminal
from support.waits import poll

CLI = [sys.executable, "-m", "actor_run"]
# as a TOML basic string: the job writes out/here.txt in its attempt's folder, then holds until the
# gate (bounded: 120 s)
HOLD = (r"""sh -c 'echo started > \"$ACTOR_RUN_OUT/here.txt\"; """
        r"""for i in $(seq 1 1200); do [ -e \"$GATE\" ] && exit 0; sleep 0.1; done'""")



def work_of(ledger: Path, seed: int) -> str:
    """The work folder of the seed's machine once its job has started ('' before)."""
    if not ledger.exists():
        return ""
    conn = sqlite3.connect(ledger)
    try:
        row = conn.execute("SELECT work FROM machines WHERE seed=? AND state='alive' AND phase='running'",
                           (seed,)).fetchone()
    except sqlite3.OperationalError:
        return ""
    finally:
        conn.close()
    return str(row[0]) if row and row[0] else ""


def run_batch(tmp: Path, body: str, environ: dict[str, str]) -> subprocess.Popen[str]:
    path = tmp / "b.toml"
    path.write_text(body)
    return subprocess.Popen([*CLI, "run", str(path), "--json", "--state-dir", str(tmp / "state"), "--out",
                             str(tmp / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=environ, cwd=tmp)


def ssh(tmp: Path, environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "ssh", "--state-dir", str(tmp / "state"), *args], capture_output=True, text=True,
                          timeout=60, env=environ, cwd=tmp, stdin=subprocess.DEVNULL)


def finish(proc: subprocess.Popen[str], gate: Path) -> None:
    gate.touch()
    try:
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


def ssh_batch(tmp: Path, sshd: Sshd, gate: Path) -> str:
    return f"""
[job]
name = "box"
command = "{HOLD}"
seeds = [1]
env = {{ GATE = "{gate}" }}

[policy]
poll_s = 0.2
""" + sshd.cloud_toml(tmp)


def test_ssh_runs_a_command_and_a_shell_in_the_job_folder_on_the_ssh_cloud(tmp_path: Path, sshd: Sshd) -> None:
    gate = tmp_path / "gate"
    environ = {**os.environ, "NO_COLOR": "1"}
    proc = run_batch(tmp_path, ssh_batch(tmp_path, sshd, gate), environ)
    try:
        work = poll(lambda: work_of(tmp_path / "state" / "ledger.sqlite", 1), 90, "the job started")
        done = ssh(tmp_path, environ, "box/1", "--", "pwd; cat out/here.txt")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [work, "started"]
        failing = ssh(tmp_path, environ, "box/seed-1", "--", "sh", "-c", "exit 7")
        assert failing.returncode == 7
        # an interactive shell under a pseudo-terminal: it starts in the job folder
        with Terminal([*CLI, "ssh", "box/1", "--state-dir", str(tmp_path / "state")],
                      env={**environ, "SHELL": "/bin/sh"}, cwd=tmp_path) as shell:
            shell.write(b"echo AT-$(pwd)-END; exit 3\n")
            assert shell.wait(60) == 3, shell.text()
        assert f"AT-{work}-END" in shell.text()
    finally:
        finish(proc, gate)
    after = ssh(tmp_path, environ, "box/1", "--", "pwd")
    assert after.returncode == 2
    assert "has no machine alive now" in after.stderr


def test_ssh_on_a_rented_fakes_machine_over_the_pinned_key(tmp_path: Path) -> None:
    server = FakeRunPod(tmp_path / "fake").start()
    gate = tmp_path / "gate"
    try:
        batch = write_batch(tmp_path, server.CLOUD, server.url, gpus=list(server.GPUS), seeds=[1],
                            settings=server.settings(), gate=gate)
        environ = {**key_env(server.KEY_VAR), "NO_COLOR": "1"}
        proc = subprocess.Popen([*CLI, "run", str(batch), "--json", "--state-dir", str(tmp_path / "state"),
                                 "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=environ, cwd=tmp_path)
        try:
            work = poll(lambda: work_of(tmp_path / "state" / "ledger.sqlite", 1), 120, "the job started")
            done = ssh(tmp_path, environ, "rented/1", "--", "pwd")
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == work
            known = list((tmp_path / "state" / "runpod" / "known_hosts.d").iterdir())
            assert len(known) == 1  # the key the controller pinned is the one held to
            known[0].write_text(known[0].read_text().replace("ssh-ed25519 AAAA", "ssh-ed25519 AAAB"))
            refused = ssh(tmp_path, environ, "rented/1", "--", "pwd")
            assert refused.returncode != 0
            assert work not in refused.stdout
        finally:
            finish(proc, gate)
    finally:
        server.stop()
    assert server.violations == []


def test_ssh_in_the_local_sandbox(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    environ = {**os.environ, "NO_COLOR": "1"}
    body = (f'[job]\nname = "loc"\ncommand = "{HOLD}"\nseeds = [2]\nenv = {{ GATE = "{gate}" }}\n'
            '[policy]\npoll_s = 0.1\n')
    proc = run_batch(tmp_path, body, environ)
    try:
        work = poll(lambda: work_of(tmp_path / "state" / "ledger.sqlite", 2), 90, "the job started")
        done = ssh(tmp_path, environ, "loc/2", "--", "cat out/here.txt; pwd")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["started", work]
    finally:
        finish(proc, gate)


def test_ssh_names_a_bad_job(tmp_path: Path) -> None:
    done = ssh(tmp_path, dict(os.environ), "Not A Job")
    assert done.returncode == 2
    assert "expected JOB/SEED" in done.stderr
