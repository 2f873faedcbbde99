"""protocols/hosts/scripts.py: what a user writes reaches a shell only as data.

A property test feeds arbitrary environment names and values, commands and machine-folder paths to
the start script on this computer's host and on an SSH host (a real sshd on loopback) and checks
that the job ran with exactly that command and environment, and that nothing was written outside
the machine folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import waits
from support.sshd import Sshd

from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.aio import open_asyncio_loop
from actor_run.protocols.hosts.base import Host
from actor_run.protocols.hosts.local import LocalHost
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.hosts.workspace import Launch, ShellWorkspace

T = TypeVar("T")

# names the shell itself sets or resets in a new process: a job's value of them is not what it sees
SHELL_OWNED = {"PWD", "OLDPWD", "SHLVL", "_", "IFS", "OPTIND", "PPID", "LINENO", "PS1", "PS2", "PS4", "HOSTNAME"}
# names that would break the checking job itself (its python), not the wrapper
BREAKS_PYTHON = ("PYTHON", "LD_", "DYLD_", "MALLOC")

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=40)
NAMES = st.one_of(
    st.sampled_from(["w", "pid", "rc", "PATH", "HOME", "SHELL", "ENV", "CDPATH", "BASH_ENV", "sh"]),
    st.from_regex(scripts.ENV_NAME, fullmatch=True).filter(lambda n: len(n) <= 30),
).filter(lambda n: scripts.env_name_problem(n) is None and n not in SHELL_OWNED and not n.startswith(BREAKS_PYTHON))
SEGMENT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0/"), min_size=1, max_size=30).filter(
    lambda s: s not in (".", "..") and len(s.encode()) < 200)
END = "AR_END_OF_TEXT"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        async with open_asyncio_loop():
            return await fn()

    return trio.run(main)


def job_command(text: str) -> str:
    """A job that writes its environment and its here-document (`text`) under out/, with no PATH lookup."""
    dump = ("import json, os, sys; out = os.environ['ACTOR_RUN_OUT']; "
            "json.dump(dict(os.environ), open(out + '/env.json', 'w')); "
            "open(out + '/text', 'w', encoding='utf-8', errors='surrogateescape').write(sys.stdin.read())")
    return f"{scripts.q(sys.executable)} -c {scripts.q(dump)} <<'{END}'\n{text}\n{END}\n"


def tree(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if skip != p and skip not in p.parents}


async def start_and_wait(host: Host, root: str, command: str, env: dict[str, str]) -> str:
    ws = ShellWorkspace(host, root)  # the root as given: no prepare(), whose output is one line
    work = ws.work_dir("job", 0, 0)
    try:
        # lost_after_s=2: its watchdog wakes each second, so it ends soon after the folder goes
        pid = await ws.start(Launch(work=work, command=command, code=None, inputs=[], env=env, lost_after_s=2))
        with trio.fail_after(30):  # the job is a python start-up
            while True:
                res = await ws.poll(work, pid, 0, 0)
                if res.state != "running":
                    break
                await trio.sleep(0.05)
        assert res.state == "exited", res
        assert res.exit_code == 0, (Path(work) / "log.txt").read_text(errors="replace")
        return work
    finally:
        await ws.aclose()


def check_start(make_host: Callable[[], Host], base: Path, segment: str, text: str, env: dict[str, str]) -> None:
    """Start `text`'s job in a new machine folder named `segment` under `base`, check, remove it."""
    base.mkdir(parents=True, exist_ok=True)
    machine = base / "machines" / str(len(list(base.glob("machines/*")))) / segment
    machine.mkdir(parents=True, mode=0o700)
    before = tree(base, machine)
    here = set(os.listdir())
    work = run(lambda: start_and_wait(make_host(), str(machine), job_command(text), env))
    out = Path(work) / "out"
    seen = json.loads((out / "env.json").read_text())
    for name, value in env.items():
        assert seen.get(name) == value, name
    assert (out / "text").read_text(encoding="utf-8", errors="surrogateescape") == text + "\n"
    assert json.loads((Path(work) / "response.json").read_text())["exit_code"] == 0
    assert int((Path(work) / "pid").read_text()) > 0
    assert tree(base, machine) == before  # nothing written beside the machine folder
    assert set(os.listdir()) == here  # nor where the controller runs
    # done with it: the watchdog ends when the folder goes
    (Path(work) / "out").chmod(0o700)
    run(lambda: _remove(make_host(), str(machine), work))


async def _remove(host: Host, root: str, work: str) -> None:
    ws = ShellWorkspace(host, root)
    try:
        await ws.remove(work)
    finally:
        await ws.aclose()


def injections() -> list[tuple[str, str, dict[str, str]]]:
    """Values that a shell would run or expand if they were not data, and the wrapper's own names."""
    return [
        ("a b", "x'; touch PWN; '$(touch PWN2)`touch PWN3`", {"w": "{outside}", "pid": "1; touch PWN4"}),
        ("$(touch PWN)", "\\\n' \" $HOME ${w} %s %n", {"PATH": "/nonexistent", "CDPATH": "{outside}"}),
        ("\n;touch x\n", "ends with a backslash\\", {"IFS": "x", "rc": "$(touch PWN)"}),
    ]


def property_test(make_host: Callable[[], Host], base: Path) -> None:
    outside = base / "outside"
    outside.mkdir(parents=True)

    def one(segment: str, text: str, env: dict[str, str]) -> None:
        env = {k: v.replace("{outside}", str(outside)) for k, v in env.items()}
        check_start(make_host, base, segment, text, env)
        assert list(outside.iterdir()) == []

    for segment, text, env in injections():
        one(segment, text, {k: v for k, v in env.items() if k not in SHELL_OWNED})

    @settings(max_examples=8, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(SEGMENT, TEXT.filter(lambda t: END not in t), st.dictionaries(NAMES, TEXT, max_size=5))
    @example("w", "", {"w": "{outside}"})
    def prop(segment: str, text: str, env: dict[str, str]) -> None:
        one(segment, text, env)

    prop()


def test_the_start_script_takes_names_values_commands_and_paths_as_data_locally(tmp_path: Path) -> None:
    property_test(lambda: LocalHost("test"), tmp_path / "local")


def test_the_start_script_takes_names_values_commands_and_paths_as_data_over_ssh(tmp_path: Path) -> None:
    with Sshd(tmp_path / "sshd") as sshd:
        def make() -> Host:
            return SSHHost("test", sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
                           known_hosts=tmp_path / "known_hosts", connect_timeout_s=5)

        property_test(make, tmp_path / "ssh")


def test_a_command_longer_than_an_exec_takes_runs(tmp_path: Path) -> None:
    """Linux holds one argument or environment string to 128 KiB: the command goes as a file."""
    text = "x" * (300 << 10)
    check_start(lambda: LocalHost("test"), tmp_path, "m", text, {"BIG": "y" * (100 << 10)})


@pytest.mark.parametrize(("name", "ok"), [
    ("X=1; touch PWN; Y", False), ("MY-VAR", False), ("", False), ("1X", False), ("ACTOR_RUN_OUT", False),
    ("ACTOR_RUN_ANYTHING", False), ("w", True), ("_x9", True), ("PATH", True),
])
def test_environment_names(name: str, ok: bool) -> None:
    assert (scripts.env_name_problem(name) is None) == ok
    if scripts.ENV_NAME.fullmatch(name) is None:  # not even a shell's name: the script is never made
        with pytest.raises(ValueError, match="environment name"):
            scripts.env_file({name: "v"})


def test_a_nul_byte_is_refused_before_a_script_is_made() -> None:
    with pytest.raises(ValueError, match="NUL"):
        scripts.start("/w", "/w/out", "echo\0x", {}, [], 10, 1, 10, "")
    with pytest.raises(ValueError, match="NUL"):
        scripts.start("/w", "/w/out", "echo", {"A": "x\0y"}, [], 10, 1, 10, "")



def _running(work: Path, pid: int, how: str) -> bool:
    """`running <pid>` (or `running_ps <pid>`) of scripts.RUNNING, run by sh for the attempt folder `work`."""
    script = f"w='{work}'\n" + scripts.RUNNING + f"{how} {pid}\n"
    return subprocess.run(["sh", "-c", script], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the /proc way is Linux's")
@pytest.mark.parametrize("how", ["running", "running_ps"])
def test_running_knows_our_job_by_its_tag_and_no_other_process(tmp_path: Path, how: str) -> None:
    """The poll, the stop and the watchdog ask `running`: it reads /proc where there is one (Linux,
    no exec) and asks `ps` elsewhere (`running_ps`); both say the same: our job (its tag on a line
    of a multi-line `sh -c` script's command line, as the wrapper's is) runs; a process without the
    tag, a zombie with the tag and a pid that is gone do not."""
    work = tmp_path / "a0"
    work.mkdir()
    (work / "tag").write_text("actor-run-0123456789abcdef\n")
    ours = subprocess.Popen(["sh", "-c", "w=$1\nsleep 60\n: the wrapper's lines", "actor-run-job", str(work),
                             "actor-run-0123456789abcdef"])
    other = subprocess.Popen(["sleep", "60"])
    zombie = subprocess.Popen(["sh", "-c", "exit 0", "actor-run-0123456789abcdef"])
    try:
        waits.poll(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30, "a zombie")
        assert _running(work, ours.pid, how)
        assert not _running(work, other.pid, how)
        assert not _running(work, zombie.pid, how)
    finally:
        for p in (ours, other, zombie):
            p.kill()
            p.wait()
    assert not _running(work, ours.pid, how)


@pytest.mark.parametrize(("lost_after_s", "within_s"), [(2, 30), (30, 8)])
def test_a_job_whose_folder_is_removed_under_it_is_stopped_by_its_watchdog(
        tmp_path: Path, lost_after_s: int, within_s: float) -> None:
    """Somebody removes the attempt's folder while the job runs (and its controller is gone, or cannot
    read it any more): the job's outputs have nowhere to go and nobody can keep its heartbeat, so its
    watchdog kills it, and ends itself. The folder is looked at every second whatever the heartbeat's
    period (lost_after_s=30: every 15 s): a delete that raced a start in flight (the watchdog's pid
    recorded after the delete looked for pids) leaves a watchdog only the folder's absence ends."""
    machine = tmp_path / "machine"
    machine.mkdir(mode=0o700)

    async def go() -> tuple[int, int, str]:
        ws = ShellWorkspace(LocalHost("test"), str(machine))
        work = ws.work_dir("job", 0, 0)
        try:
            pid = await ws.start(Launch(work=work, command="sleep 120", code=None, inputs=[], env={},
                                        lost_after_s=lost_after_s))
        finally:
            await ws.aclose()
        return pid, int((Path(work) / "watchdog.pid").read_text()), work

    pid, watchdog, work = run(go)
    job = psutil.Process(pid)
    dog = psutil.Process(watchdog)
    # as somebody's `rm -rf` does, again while the job's shell still writes a file into it (one pass
    # fails "Directory not empty" when a file is made behind it: failed once in a full run)
    def removed() -> bool:
        subprocess.run(["rm", "-rf", work], capture_output=True, timeout=30)
        return not os.path.exists(work)

    waits.poll(removed, 30, f"{work} removed", every=0.1)
    _, alive = psutil.wait_procs([job, dog], timeout=within_s)  # a second's look, on a loaded machine
    assert alive == [], [p.pid for p in alive]


def test_started_finds_the_job_a_dead_controller_started_and_ends_one_cut_off_half_way(tmp_path: Path) -> None:
    """`Workspace.started` (asked by a resumed attempt whose start the ledger never recorded): the pid
    and start of a job that runs in the attempt's folder; (0, 0) where none was started; and where a
    start was cut off after it launched the job but before it wrote the pid (the tag is there, the pid
    not), everything carrying the tag is ended first, so that the fresh start is the only run."""
    machine = tmp_path / "machine"
    machine.mkdir(mode=0o700)
    tag = "actor-run-00112233445566ff"
    half = machine / "half"
    half.mkdir()
    (half / "tag").write_text(tag + "\n")
    orphan = subprocess.Popen(["sleep", "120"], env={**os.environ, "ACTOR_RUN_TAG": tag}, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "121"], env={**os.environ, "ACTOR_RUN_TAG": tag[:-1] + "0"},
                                 start_new_session=True)

    async def go() -> tuple[tuple[int, float], tuple[int, float], tuple[int, float], int]:
        ws = ShellWorkspace(LocalHost("test"), str(machine))
        try:
            work = ws.work_dir("job", 0, 0)
            before = time.time()
            pid = await ws.start(Launch(work=work, command="sleep 120", code=None, inputs=[], env={},
                                        lost_after_s=30))
            found = await ws.started(work)
            none = await ws.started(ws.work_dir("job", 0, 1))
            cut = await ws.started(str(half))
            await ws.stop(work)
            dog = psutil.Process(int((Path(work) / "watchdog.pid").read_text()))
            await ws.remove(work)
            psutil.wait_procs([dog], timeout=30)  # it ends once its folder is gone
        finally:
            await ws.aclose()
        assert found[1] >= int(before) - 1
        return found, none, cut, pid

    try:
        found, none, cut, pid = run(go)
        assert found[0] == pid
        assert none == (0, 0.0)
        assert cut == (0, 0.0)
        assert orphan.wait(timeout=30) is not None  # reaped by its tag
        assert bystander.poll() is None  # another attempt's mark: left alone
    finally:
        for p in (orphan, bystander):
            p.kill()
            p.wait()
