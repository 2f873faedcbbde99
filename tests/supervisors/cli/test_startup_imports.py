"""Each `actor-run` command imports only what it needs (issue 24: every process paid ~0.7 s of CPU
importing the whole package). The commands that read the ledger or print what they know
(status, runs, cost, logs, report, cancel of an ended run, config show, completion, --version)
run here on a real ledger, made by a real `actor-run run`, in a process that prints at its exit
which modules it loaded: the supervision tree, the actors, trio, pykka and the network libraries
are not among them. What each still prints is checked too, so a command cut short cannot pass.

The commands that run a batch load the tree, but not what a local batch leaves unused: rich (no
view is drawn off a terminal or under --json), asyncssh and httpx (the rented clouds the user's
config names, without keys here, are built for the sweep and load them only to be used)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.waits import poll

from actor_run.protocols.redact import REDACTED

# `python -m actor_run ARGS`, printing sorted(sys.modules) on stderr when the process exits
PROBE = ("import atexit, runpy, sys\n"
         "atexit.register(lambda: print('MODULES ' + ' '.join(sorted(sys.modules)), file=sys.stderr))\n"
         "sys.argv = ['actor-run', *sys.argv[1:]]\n"
         "runpy.run_module('actor_run', run_name='__main__')\n")
# what running a batch needs and reading about one does not
NOT_FOR_READING = ("trio", "pykka", "asyncssh", "httpx", "rich", "actor_run.actors",
                   "actor_run.supervisors.api.runner", "actor_run.supervisors.api.handle",
                   "actor_run.supervisors.tree.batch",
                   "actor_run.supervisors.ledger.writer", "actor_run.supervisors.views.live")


class Ran:
    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.code = done.returncode
        self.stdout = done.stdout
        *rest, last = done.stderr.splitlines() or [""]
        assert last.startswith("MODULES "), done.stderr  # the process reached its exit
        self.stderr = "\n".join(rest)
        self.modules = set(last.split()[1:])

    def heavy(self) -> list[str]:
        """The modules of NOT_FOR_READING (or under them) this process loaded."""
        return sorted(m for m in self.modules if any(m == h or m.startswith(h + ".") for h in NOT_FOR_READING))


def actor_run(*args: str, cwd: Path, env: dict[str, str]) -> Ran:
    return Ran(subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                              cwd=cwd, env=env))


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    """A folder whose ledger holds one ended run of two seeds (run by the real command), the
    environment to read it with, and the run's id."""
    tmp = tmp_path_factory.mktemp("startup")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", "XDG_STATE_HOME": str(tmp / "xdg-state"),
           "XDG_CONFIG_HOME": str(tmp / "xdg-config")}
    for name in ("ACTOR_RUN_LEDGER", "ACTOR_RUN_CONFIG"):
        env.pop(name, None)
    (tmp / "batch.toml").write_text(
        '[job]\nname = "hello"\ncommand = "sh -c \'echo hello {seed}; echo {seed} > $ACTOR_RUN_OUT/seed.txt\'"\n'
        "seeds = [1, 2]\n\n[policy]\npoll_s = 0.1\n")
    done = actor_run("run", "batch.toml", "--out", "out", cwd=tmp, env=env)
    assert done.code == 0, done.stderr
    assert {"trio", "pykka", "actor_run.supervisors.api.runner"} <= done.modules  # `run` loads what it runs with
    assert (tmp / "out").is_dir()
    [run] = [line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("run ")]
    return tmp, env, run


@pytest.mark.parametrize(("args", "code", "shows"), [
    (["status"], 0, "(succeeded)"),
    (["status", "--json"], 0, '"kind":"job"'),
    (["runs"], 0, "succeeded"),
    (["runs", "--json"], 0, '"state":"succeeded"'),
    (["cost"], 0, "hello/seed-2"),
    (["cost", "--json", "--by", "cloud"], 0, '"group":"local"'),
    (["logs", "hello/1"], 0, "hello 1"),
    (["report", "--out", "report.html"], 0, "report.html"),
    (["config", "show"], 0, "no cloud settings"),
    (["completion", "bash"], 0, "complete -o filenames -F _actor_run actor-run"),
    (["completion", "zsh"], 0, "#compdef actor-run"),
    (["--version"], 0, "actor-run "),
    (["status", "--help"], 0, "--follow"),
])
def test_a_command_that_reads_loads_no_tree_no_reactor_no_network(
        ran: tuple[Path, dict[str, str], str], args: list[str], code: int, shows: str) -> None:
    tmp, env, run = ran
    done = actor_run(*args, cwd=tmp, env=env)
    assert (done.code, done.stderr) == (code, ""), done.stderr
    assert shows in done.stdout, done.stdout
    if args[0] in ("status", "runs", "cost") and not {"--help", "--by"} & set(args):
        assert run in done.stdout  # it read the ledger the run wrote
    assert done.heavy() == [], args


def test_cancel_of_an_ended_run_loads_no_tree(ran: tuple[Path, dict[str, str], str]) -> None:
    tmp, env, run = ran
    for target in (run, "hello/1"):
        done = actor_run("cancel", target, cwd=tmp, env=env)
        assert (done.code, done.stdout.strip()) == (1, f"nothing to cancel: {target} has ended (succeeded)")
        assert done.heavy() == [], target


def test_only_version_reads_the_installed_metadata(ran: tuple[Path, dict[str, str], str]) -> None:
    """importlib.metadata is about 50 ms of CPU: `--version` pays it, `status` does not, nor does
    loguru (it imports asyncio) load where nothing logs."""
    tmp, env, _ = ran
    assert "importlib.metadata" in actor_run("--version", cwd=tmp, env=env).modules
    status = actor_run("status", cwd=tmp, env=env)
    assert "importlib.metadata" not in status.modules
    assert "loguru" not in status.modules
    assert "asyncio" not in status.modules


def test_status_follow_of_an_ended_run_loads_no_loguru(ran: tuple[Path, dict[str, str], str]) -> None:
    """`status --follow` warns only when the ledger cannot be read: loguru (asyncio with it, about
    0.1 s of CPU) loads then, not in every follow."""
    tmp, env, _ = ran
    done = actor_run("status", "--follow", cwd=tmp, env=env)
    assert (done.code, done.stderr) == (0, ""), done.stderr
    assert "hello/seed-2" in done.stdout
    assert "succeeded" in done.stdout
    assert "loguru" not in done.modules
    assert "asyncio" not in done.modules
    assert done.heavy() == []


def test_logging_is_set_up_by_whoever_first_imports_loguru(tmp_path: Path) -> None:
    """configure_logging before loguru is loaded: the first module to import it gets the command's
    sink (WARNING and above, one line each, a secret redacted), not loguru's default (DEBUG)."""
    script = ("import sys\n"
              "from actor_run.protocols.redact import add_secret\n"
              "from actor_run.supervisors.cli.console import configure_logging\n"
              "add_secret('sk-abcdefabcdefabcdef')\n"
              "configure_logging()\n"
              "assert 'loguru' not in sys.modules\n"
              "from loguru import logger\n"
              "logger.debug('a debug line'); logger.info('an info line')\n"
              "logger.bind(job='j/seed-1').warning('key {}', 'sk-abcdefabcdefabcdef')\n"
              "configure_logging()  # again, with loguru loaded: the same one sink\n"
              "logger.warning('once')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = [line.split(" ", 1)[1] for line in done.stderr.splitlines()]  # after the time of day
    assert shown == [f"WARNING j/seed-1: key {REDACTED}", "WARNING once"], done.stderr


# what a local batch leaves unused: the terminal's view and the rented clouds' network libraries
NOT_FOR_A_LOCAL_BATCH = ("rich", "asyncssh", "httpx", "cryptography")
HELD = ('[job]\nname = "held"\ncommand = "sh -c \'while [ ! -e {go} ]; do sleep 0.05; done; echo held {seed}\'"\n'
        "seeds = [1, 2]\n\n[policy]\npoll_s = 0.1\n")


def unused(done: Ran) -> list[str]:
    return sorted(m for m in done.modules if any(m == h or m.startswith(h + ".") for h in NOT_FOR_A_LOCAL_BATCH))


@pytest.fixture(scope="module")
def cloudy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A folder with a local batch, and an environment whose user config names three rented clouds
    whose keys are not set: every sweep builds them and is told why they cannot be used."""
    tmp = tmp_path_factory.mktemp("cloudy")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", "XDG_STATE_HOME": str(tmp / "xdg-state"),
           "XDG_CONFIG_HOME": str(tmp / "xdg-config")}
    for name in ("ACTOR_RUN_LEDGER", "ACTOR_RUN_CONFIG", "RUNPOD_API_KEY", "LAMBDA_API_KEY", "HYPERSTACK_API_KEY",
                 "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    (tmp / "xdg-config" / "actor-run").mkdir(parents=True)
    (tmp / "xdg-config" / "actor-run" / "config.toml").write_text(
        '[clouds.runpod]\ncloud = "SECURE"\n\n[clouds.lambda]\n\n[clouds.hyperstack]\n')
    (tmp / "batch.toml").write_text(
        '[job]\nname = "hello"\ncommand = "sh -c \'echo hello {seed}\'"\nseeds = [1, 2]\n\n[policy]\npoll_s = 0.1\n')
    return tmp, env


def test_a_local_run_loads_no_rich_and_no_network_library(cloudy: tuple[Path, dict[str, str]]) -> None:
    """`run --json` and `run` with its output to a pipe (every test's, every script's) draw no live
    view: rich is not loaded, nor asyncssh and httpx for the rented clouds the sweep only names."""
    tmp, env = cloudy
    done = actor_run("run", "batch.toml", "--json", "--out", "out", cwd=tmp, env=env)
    assert done.code == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["outcome"] for e in events if e["type"] == "JobEnded"] == ["succeeded", "succeeded"]
    assert "RUNPOD_API_KEY" in done.stderr  # the sweep built runpod from the config, and said why it cannot
    assert {"trio", "pykka", "actor_run.supervisors.api.runner"} <= done.modules
    assert unused(done) == []

    done = actor_run("run", "batch.toml", "--out", "out", cwd=tmp, env=env)
    assert done.code == 0, done.stderr
    assert "┃ job" in done.stdout
    assert "│ hello/seed-2 │ succeeded │" in done.stdout
    assert unused(done) == []


def test_sweep_and_resume_of_a_local_run_load_no_network_library(cloudy: tuple[Path, dict[str, str]]) -> None:
    """A controller killed (SIGKILL) mid-run; `sweep` lists its machines and `resume` takes its jobs
    over to their end, neither loading asyncssh, httpx or rich."""
    tmp, env = cloudy
    go = tmp / "go"
    (tmp / "held.toml").write_text(HELD.replace("{go}", str(go)))
    out = tmp / "held.jsonl"
    with out.open("w") as sink:
        run = subprocess.Popen([sys.executable, "-m", "actor_run", "run", "held.toml", "--json", "--out", "out"],
                               cwd=tmp, env=env, stdout=sink, stderr=subprocess.DEVNULL)
        try:
            poll(lambda: out.read_text().count('"type":"JobStarted"') == 2, 120, "both jobs started")
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait(30)

    try:
        done = actor_run("sweep", "--dry-run", cwd=tmp, env=env)
        assert done.code == 0, done.stderr
        assert done.stdout.count("would delete  its owner is gone") == 2, done.stdout
        assert unused(done) == []

        go.touch()
        done = actor_run("resume", cwd=tmp, env=env)
        assert done.code == 0, done.stderr
        assert "resuming 2 job(s)" in done.stdout
        assert "(reattached)" in done.stdout
        assert unused(done) == []
    finally:
        go.touch()  # a failed test lets its held jobs end (no_leaks watches tmp_path, not this folder)


@pytest.mark.parametrize(("args", "shows"), [(["offers"], "sim"), (["clouds", "check"], "cannot check")])
def test_offers_and_clouds_check_load_no_network_library_for_clouds_without_a_key(
        cloudy: tuple[Path, dict[str, str]], args: list[str], shows: str) -> None:
    tmp, env = cloudy
    done = actor_run(*args, cwd=tmp, env=env)
    assert shows in done.stdout
    assert "RUNPOD_API_KEY" in done.stdout + done.stderr
    assert unused(done) == []
