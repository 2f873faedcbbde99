"""A newcomer's first hour (issue 46), through the CLI as a user runs it: every number and word on
the screen checked against the ledger, every command safe to mistype."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import run_cli

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def cli(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([str(a) for a in args], timeout=timeout, cwd=cwd, env=env or ENV)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- item 3: reading commands read ------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["runs"], ["cost"], ["report"], ["logs", "job/1"]])
def test_a_reading_command_on_a_mistyped_ledger_makes_nothing_and_says_so(tmp_path: Path,
                                                                        command: list[str]) -> None:
    before = tree(tmp_path)
    missing = tmp_path / "typo" / "ledger.sqlite"
    done = cli(*command, "--ledger", missing, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"actor-run: --ledger {missing}: no such ledger file\n")
    assert tree(tmp_path) == before  # no folder, no file
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    done = cli(*command, "--ledger", empty, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"actor-run: --ledger {empty} is an empty file, not a ledger\n")
    assert empty.read_bytes() == b""  # not turned into a database
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    done = cli(*command, "--ledger", text, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"actor-run: --ledger {text} is not an actor-run ledger (not an SQLite file)\n"
    assert text.read_text() == "my notes\n"
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    done = cli(*command, "--ledger", other, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"actor-run: --ledger {other} is an SQLite file but not an actor-run ledger\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite", "notes.txt", "other.sqlite"]


def test_status_before_any_run_makes_no_state_folder(tmp_path: Path) -> None:
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("ACTOR_RUN_LEDGER", None)
    for command in (["status"], ["runs"]):
        done = cli(*command, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert "no run in the ledger" in done.stdout
    assert not (tmp_path / "state").exists()


# --- item 1: a GPU is sold by a cloud, never claimed by this computer ------------------------------


def settings_env(tmp_path: Path, text: str | None) -> dict[str, str]:
    """ENV with the user's settings file (None: none) and a state folder under tmp_path."""
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("ACTOR_RUN_CONFIG", None)
    env.pop("ACTOR_RUN_LEDGER", None)
    if text is not None:
        (tmp_path / "config" / "actor-run").mkdir(parents=True)
        (tmp_path / "config" / "actor-run" / "config.toml").write_text(text)
    return env


def test_a_gpu_no_configured_cloud_sells_is_exit_2_naming_the_clouds_asked(tmp_path: Path) -> None:
    env = settings_env(tmp_path, None)
    done = cli("run", "--gpu", "H100", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("actor-run: --gpu: no configured cloud sells 'H100' (your settings ")
    assert "name no [clouds.<name>]" in done.stderr
    assert not (tmp_path / "state" / "actor-run" / "local").exists()  # nothing ran on this computer
    local = cli("run", "--gpu", "H100", "--cloud", "local", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert local.returncode == 2
    assert local.stderr.startswith("actor-run: candidates[0].gpu: local has no GPU 'H100' (this computer claims none")
    env = settings_env(tmp_path / "b", "[clouds.sim]\nlaunch_latency_s = 0.01\n[clouds.local]\nmax_machines = 2\n")
    typo = cli("run", "--gpu", "H1000", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert typo.returncode == 2
    assert typo.stderr.startswith("actor-run: --gpu: no configured cloud sells 'H1000' (asked: sim, local;")
    assert "did you mean 'H100'" in typo.stderr
    walked = cli("run", "--gpu", "a100", "--print-batch", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert walked.returncode == 0, walked.stderr
    assert 'cloud = "sim"\ngpu = "a100"' in walked.stdout
    assert 'cloud = "local"' not in walked.stdout


def test_a_one_liner_runs_on_the_configured_cloud_that_sells_the_gpu(tmp_path: Path) -> None:
    env = settings_env(tmp_path, '[clouds.sim]\nlaunch_latency_s = 0.01\ndelete_latency_s = 0.0\n'
                                 '[clouds.local]\ngpus = ["RTX4090"]\n')
    done = cli("run", "--gpu", "H100", "--json", "--", "true", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert '"cloud":"sim"' in done.stdout
    assert '"cloud":"local"' not in done.stdout
    mine = cli("run", "--gpu", "RTX4090", "--json", "--", "true", cwd=tmp_path, env=env)
    assert mine.returncode == 0, mine.stderr
    assert '"cloud":"local"' in mine.stdout
    assert '"cloud":"sim"' not in mine.stdout


def test_clouds_check_sim_names_every_gpu_it_sells_where(tmp_path: Path) -> None:
    env = settings_env(tmp_path, None)
    done = cli("clouds", "check", "sim", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [x for x in lines if x.startswith("  A100") and not x.startswith("  A100:8")] == [
        "  A100: in stock in ap-south at $1.50/h, stock 2", "  A100: in stock in us-east at $1.80/h, stock 8",
        "  A100: in stock in eu-west at $2.10/h, stock 4"]
    assert [x for x in lines if x.startswith("  H100") and not x.startswith("  H100:8")] == [
        "  H100: in stock in us-east at $2.90/h, stock 4", "  H100: in stock in eu-west at $3.20/h, stock 2"]
    assert "out of stock" not in done.stdout  # it sells nothing else, so says nothing else


# --- item 2: one cost figure everywhere ----------------------------------------------------------------


SLOW_SIM = """
[job]
name = "slow"
command = "sleep 60"
seeds = [1, 2]
timeout_s = 600

[policy]
poll_s = 0.1
setup_grace_s = 60
stall_after_s = 120

[[candidates]]
cloud = "sim"
gpu = "H100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.0
regions = [{ name = "us-east", gpus = { H100 = { stock = 4, hourly_usd = 36.0 } } }]
"""


def test_status_runs_cost_and_report_agree_after_a_sweep_charged_a_dead_controllers_machine(
        tmp_path: Path) -> None:
    import json
    import re
    import signal

    from support.cli_inproc import start_cli

    (tmp_path / "b.toml").write_text(SLOW_SIM)
    env = settings_env(tmp_path, None)
    proc = start_cli(["run", "b.toml", "--json"], cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        started = 0
        for line in proc.stdout:
            started += json.loads(line)["type"] == "JobStarted"
            if started == 2:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    swept = cli("sweep", cwd=tmp_path, env=env)
    assert swept.returncode == 0, swept.stderr
    cost = [json.loads(x) for x in cli("cost", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    total = next(c for c in cost if c["group"] == "total")
    assert total["spent_usd"] > 0.001  # the sweep charged what the machines cost ($36/h)
    by_job = {c["group"]: c for c in cost if c["group"] != "total"}
    runs = [json.loads(x) for x in cli("runs", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    # one figure, each command printing it to its own precision: equal to the cent's hundredth
    assert [round(r["usd"], 4) for r in runs] == [round(total["spent_usd"], 4)]
    assert runs[0]["state"] == "abandoned"
    status = [json.loads(x) for x in cli("status", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    jobs = {d["key"]: d for d in status if d["kind"] == "job"}
    assert {k: round(v["usd_now"], 4) for k, v in jobs.items()} == {
        k: round(c["spent_usd"], 4) for k, c in by_job.items()}
    human = cli("status", cwd=tmp_path, env=env).stdout
    for key, c in by_job.items():
        assert re.search(rf"{re.escape(key)} +\w+ +1 attempt\(s\) \${c['spent_usd']:.4f}", human), human
    report = cli("report", "--out", tmp_path / "r.html", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert f"${total['spent_usd']:.4f}; started" in page


# --- item 4: counts and words the ledger backs ------------------------------------------------------


WALK = """
[job]
name = "walker"
command = "true"
seeds = [1, 2]

[policy]
max_attempts = 1
poll_s = 0.1

[[candidates]]
cloud = "sim"
gpu = "A100"
accounts = ["dry"]

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.0

[clouds.sim.accounts.dry]
no_capacity_rate = 1.0
"""


def test_walk_steps_are_not_attempts_anywhere(tmp_path: Path) -> None:
    import json

    (tmp_path / "w.toml").write_text(WALK)
    env = settings_env(tmp_path, None)
    done = cli("run", "w.toml", cwd=tmp_path, env=env)
    # max_attempts = 1 and both succeeded: the three places without stock before cost no attempt
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ walker/seed-")]
    assert len(rows) == 2
    assert all(line.split("│")[3].strip() == "1" for line in rows), done.stdout
    status = [json.loads(x) for x in cli("status", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    assert [d["attempts"] for d in status if d["kind"] == "job"] == [1, 1]
    assert cli("status", cwd=tmp_path, env=env).stdout.count(" 1 attempt(s) ") == 2
    cost = [json.loads(x) for x in cli("cost", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    assert [c["attempts"] for c in cost] == [1, 1, 2]
    responses = sorted((tmp_path / "actor-run-out" / "latest" / "walker").glob("seed-*/response.json"))
    assert len(responses) == 2


CANCELABLE = """
[job]
name = "held"
command = "sleep 120"
seeds = [1, 2]

[policy]
poll_s = 0.1
"""


def test_a_canceled_job_is_canceled_with_its_own_exit_code(tmp_path: Path) -> None:
    import json

    from support.cli_inproc import start_cli

    (tmp_path / "c.toml").write_text(CANCELABLE)
    env = settings_env(tmp_path, None)
    proc = start_cli(["run", "c.toml", "--json"], cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        run = proc.stderr.readline().split()[1].rstrip(":")
        started = 0
        for line in proc.stdout:
            started += json.loads(line)["type"] == "JobStarted"
            if started == 2:
                break
        canceled = cli("cancel", run, cwd=tmp_path, env=env)
        assert canceled.returncode == 0, canceled.stderr
        ended = [json.loads(x) for x in proc.stdout if '"JobEnded"' in x]
        assert proc.wait(60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    assert [(e["outcome"], e["failure"]) for e in ended] == [("canceled", "canceled")] * 2
    runs = [json.loads(x) for x in cli("runs", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    assert [(r["state"], r["failed"], r["canceled"]) for r in runs] == [("canceled", 0, 2)]
    human = cli("status", cwd=tmp_path, env=env).stdout
    import re

    assert len(re.findall(r"held/seed-\d +canceled +1 attempt\(s\) ", human)) == 2, human
    assert " failed " not in human


# --- item 9: status shows what is running, whoever started it; did you mean ---------------------------


def test_status_shows_every_unfinished_run_then_the_latest_ended_and_says_resume_for_an_abandoned_one(
        tmp_path: Path) -> None:
    import json
    import signal

    from support.cli_inproc import start_cli

    env = settings_env(tmp_path, None)
    (tmp_path / "long.toml").write_text('[job]\nname = "long"\ncommand = "sleep 120"\nseeds = [1]\n'
                                        '[policy]\npoll_s = 0.1\n')
    (tmp_path / "short.toml").write_text('[job]\nname = "short"\ncommand = "true"\nseeds = [1]\n'
                                         '[policy]\npoll_s = 0.1\n')
    first = cli("run", "short.toml", cwd=tmp_path, env=env)  # an older ended run: not shown any more
    assert first.returncode == 0, first.stderr
    proc = start_cli(["run", "long.toml", "--json"], cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        long_run = proc.stderr.readline().split()[1].rstrip(":")
        for line in proc.stdout:
            if json.loads(line)["type"] == "JobStarted":
                break
        later = cli("run", "short.toml", cwd=tmp_path, env=env)  # someone's newer run, ended
        assert later.returncode == 0, later.stderr
        short_run = later.stdout.split()[1].rstrip(":")
        shown = cli("status", cwd=tmp_path, env=env).stdout
        heads = [line.split()[1] for line in shown.splitlines() if line.startswith("run ")]
        assert heads == [long_run, short_run], shown
        assert f"run {long_run} (running)" in shown
        assert "long/seed-1" in shown
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        shown = cli("status", cwd=tmp_path, env=env).stdout
        assert f"run {long_run} (abandoned)" in shown, shown
        assert f"`actor-run resume {long_run}`" in shown, shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
        swept = cli("sweep", cwd=tmp_path, env=env)  # the dead controller's sandbox goes
        assert swept.returncode == 0, swept.stderr


@pytest.mark.parametrize(("text", "message"), [
    ('[job]\nname = "x"\ncommand = "true"\nseedz = [1]\n', "job.seedz: unknown key (did you mean 'seeds'?)"),
    ('[job]\nname = "x"\ncommand = "true"\nseeds = [1]\n[polcy]\nmax_attempts = 2\n',
     "polcy: unknown key (did you mean 'policy'?)"),
    ('[job]\nname = "x"\ncommand = "true"\nseeds = [1]\n[policy]\nmax_attemps = 2\n',
     "policy.max_attemps: unknown key (did you mean 'max_attempts'?)"),
    ('[job]\nname = "x"\ncommand = "true"\nseeds = [1]\n[[candidates]]\ncloud = "sim"\ngpus = "A100"\n',
     "candidates[0].gpus: unknown key (did you mean 'gpu'?)"),
    ('[job]\nname = "x"\ncommand = "true"\nseeds = [1]\n[[candidates]]\ncloud = "sim"\n[clouds.sim]\n'
     'launch_latncy_s = 1\n', "clouds.sim.launch_latncy_s: unknown key (did you mean 'launch_latency_s'?) (set in "
                              "batch)"),
])
def test_an_unknown_key_in_a_batch_says_which_was_meant(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "b.toml").write_text(text)
    done = cli("run", "b.toml", cwd=tmp_path, env=settings_env(tmp_path, None))
    assert (done.returncode, done.stderr) == (2, f"actor-run: {message}\n")


def test_unknown_settings_keys_and_commands_say_which_was_meant(tmp_path: Path) -> None:
    env = settings_env(tmp_path, "confirm_abov_usd = 3\n")
    done = cli("runs", cwd=tmp_path, env=env)  # a reading command does not read the settings
    assert done.returncode == 0
    done = cli("run", "--cloud", "sim", "--", "true", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "confirm_abov_usd: unknown key" in done.stderr
    assert "did you mean 'confirm_above_usd'?" in done.stderr
    env = settings_env(tmp_path / "b", "[clouds.sim]\nlaunch_latncy_s = 1\n")
    done = cli("run", "--cloud", "sim", "--", "true", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "clouds.sim.launch_latncy_s: unknown key (did you mean 'launch_latency_s'?)" in done.stderr
    for typo, meant in (("stauts", "status"), ("rnu", "run"), ("sweeep", "sweep")):
        done = cli(typo, cwd=tmp_path, env=env)
        assert done.returncode == 2
        assert f"invalid choice: '{typo}' (did you mean '{meant}'" in done.stderr, done.stderr
    done = cli("clouds", "chek", cwd=tmp_path, env=env)
    assert "invalid choice: 'chek' (did you mean 'check'?" in done.stderr


# --- item 6: a one-liner sends the folder it is run in ---------------------------------------------------


def test_a_one_liner_sends_the_current_folder_without_what_the_ignore_files_list(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "home", None)
    work = tmp_path / "project"
    (work / "data").mkdir(parents=True)
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref\n")
    # (`.complete` is the published copy's own marker)
    (work / "train.py").write_text("import os\nprint(sorted(set(os.listdir('.')) - {'.complete'}))\n"
                                   "print(sorted(os.listdir('data')))\n")
    (work / "data" / "keep.txt").write_text("k")
    (work / "data" / "skip.bin").write_text("s")
    (work / "model.ckpt").write_text("c")
    (work / ".actor-runignore").write_text("# big files stay here\n*.ckpt\n")
    (work / ".gitignore").write_text("data/*.bin\n")
    done = cli("run", "--cloud", "sim", "--gpu", "A100", "--", "python3 train.py", cwd=work, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (work / "actor-run-out" / "latest" / "train" / "seed-1" / "log.txt").read_text()
    assert "['.actor-runignore', '.gitignore', 'data', 'train.py']" in log, log
    assert "['keep.txt']" in log, log
    again = cli("run", "--cloud", "sim", "--gpu", "A100", "--", "python3 train.py", cwd=work, env=env)
    assert again.returncode == 0  # the first run's results (actor-run-out/) are not sent back up
    log = (work / "actor-run-out" / "latest" / "train" / "seed-1" / "log.txt").read_text()
    assert "'actor-run-out'" not in log


def test_a_one_liner_in_a_folder_too_big_to_send_says_so_in_one_line(tmp_path: Path) -> None:
    from actor_run.supervisors.cli.batch_file import CWD_CODE_LIMIT

    env = settings_env(tmp_path / "home", None)
    work = tmp_path / "big"
    work.mkdir()
    with (work / "weights.bin").open("wb") as f:
        f.truncate(CWD_CODE_LIMIT + 1)  # sparse: no disk used
    done = cli("run", "--cloud", "sim", "--", "true", cwd=work, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"actor-run: --code: the current folder {work} holds more than 100 MB to send (a one-liner sends it as its "
        "code): list what stays here in .actor-runignore, or name the folder to send with --code DIR"]
    (work / ".actor-runignore").write_text("*.bin\n")
    done = cli("run", "--cloud", "sim", "--print-batch", "--", "true", cwd=work, env=env)
    assert done.returncode == 0, done.stderr
    assert f'code = "{work}"' in done.stdout


# --- item 4: a relative path in the Python API is the caller's, as on the command line -----------------


def test_a_jobs_relative_code_is_taken_from_the_callers_folder(tmp_path: Path) -> None:
    import sys

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "x.py").write_text("print('from the code folder')\n")
    (tmp_path / "in.txt").write_text("input\n")
    script = ("from actor_run import Job, Runner\n"
              "with Runner(out_dir='out', state_dir='state') as r:\n"
              "    h = r.submit(Job(name='demo', command='python3 x.py; cat $ACTOR_RUN_IN/data/in.txt', seed=1,"
              " code='code', inputs={'data': 'in.txt'}))\n"
              "    e = h.result()\n"
              "    print(e.outcome, e.detail)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=settings_env(tmp_path, None), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "succeeded", done.stdout + done.stderr
    log = (tmp_path / "out" / "latest" / "demo" / "seed-1" / "log.txt").read_text()
    assert "from the code folder" in log
    assert "input" in log


# --- item 8: env as users expect it ---------------------------------------------------------------------


def test_plain_env_stays_plain_and_secrets_are_masked_and_taken_from_the_environment(tmp_path: Path) -> None:
    import json

    (tmp_path / "e.toml").write_text(
        '[job]\nname = "envs"\nseeds = [1]\n'
        'command = "sh -c \'echo $PROJECT $WANDB_API_KEY $MY_PRIVATE > $ACTOR_RUN_OUT/seen.txt\'"\n'
        'env = { PROJECT = "demo-project", WANDB_API_KEY = "sk-not-for-the-ledger" }\n'
        'secret_env = ["MY_PRIVATE"]\n[policy]\npoll_s = 0.1\n')
    env = {**settings_env(tmp_path, None), "MY_PRIVATE": "from-my-shell-only"}
    done = cli("run", "e.toml", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    seen = (tmp_path / "actor-run-out" / "latest" / "envs" / "seed-1" / "out" / "seen.txt").read_text()
    assert seen == "demo-project sk-not-for-the-ledger from-my-shell-only\n"
    ledger = b"".join(p.read_bytes() for p in (tmp_path / "state" / "actor-run").glob("ledger.sqlite*"))
    assert b"demo-project" in ledger  # a plain value stays plain: a worker elsewhere gets it as it is
    assert b"sk-not-for-the-ledger" not in ledger
    assert b"from-my-shell-only" not in ledger
    jobs = sqlite3.connect(tmp_path / "state" / "actor-run" / "ledger.sqlite").execute("SELECT spec FROM jobs")
    kept = json.loads(jobs.fetchone()[0])
    jobs.connection.close()
    assert kept["env"]["PROJECT"] == "demo-project"
    assert kept["env"]["WANDB_API_KEY"] != "sk-not-for-the-ledger"
    assert kept["env"]["MY_PRIVATE"] == kept["env"]["WANDB_API_KEY"]  # the mask: a worker fills both from its env
    assert "from-my-shell-only" not in done.stdout + done.stderr
