"""The `skypilot` cloud and the fake `sky` against SkyPilot 0.14.1 itself, run offline in its own
virtual environment (scripts/test.sh makes it: `.venv-sky`, or $ACTOR_RUN_SKY_PYTHON): every command
line the adapter builds goes through SkyPilot's own click parser; what the fake prints is what
SkyPilot's own CLI code prints for the same answers; SkyPilot's own autostop check says what our
SSH connection counts for; the README's key path is where SkyPilot keeps the key."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from fakes.sky import CATALOG, FakeSky, has_active_ssh_sessions
from support.sshd import Sshd

from actor_run.protocols.clouds import parse_settings
from actor_run.protocols.clouds.skypilot import SkyPilotCloud, hold_command
from actor_run.protocols.failures import LaunchAmbiguous
from actor_run.protocols.hosts.aio import open_asyncio_loop
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.messages import Offer
from actor_run.protocols.names import encode_name
from actor_run.protocols.specs import CandidateSpec

ROOT = Path(__file__).resolve().parents[3]
OWN = ROOT / "tests" / "support" / "sky_own.py"
PIN = "0.14.1"


class SkyOwn:
    """SkyPilot's own code (tests/support/sky_own.py) in one long-lived process of its interpreter: SkyPilot
    is imported once, and each answer comes from a fork of that process, in a HOME of the test's own.
    The process detaches (a test that checks it left no child behind does not see it) and ends when
    its stdin closes: at `close`, or when this test process ends."""

    def __init__(self, python: str, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([python, str(OWN), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, **self.env(home)})
        self.proc.wait(timeout=60)  # the process we started forks the server and exits at once
        self.replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="sky-own").start()

    @staticmethod
    def env(home: Path) -> dict[str, str]:
        return {"HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put("")  # the process ended

    def ask(self, what: str, request: Any, home: Path) -> Any:
        home.mkdir(parents=True, exist_ok=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"what": what, "request": request, "env": self.env(home)}) + "\n")
        self.proc.stdin.flush()
        line = self.replies.get(timeout=300)
        assert line, "SkyPilot's process ended (its stderr is the test's)"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"][-3000:]
        return reply["answer"]

    def close(self) -> None:
        """Its stdin closed, the process (detached: not our child) ends by itself."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()


@pytest.fixture(scope="session")
def sky_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyOwn]:
    """SkyPilot's interpreter, once per test process; its absence fails the test (scripts/test.sh
    always makes it)."""
    python = os.environ.get("ACTOR_RUN_SKY_PYTHON") or str(ROOT / ".venv-sky" / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(f"SkyPilot's venv is missing ({python}): scripts/test.sh makes it (skypilot=={PIN})")
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('skypilot'))"],
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert version == PIN
    own = SkyOwn(python, tmp_path_factory.mktemp("sky-own-home"))
    yield own
    own.close()


def cloud(tmp_path: Path, sshd: Sshd, fake: FakeSky, **kw: Any) -> SkyPilotCloud:
    return SkyPilotCloud(parse_settings("skypilot", {
        "sky": str(fake.command), "infra": "aws/us-east-1", "ssh_key": str(sshd.user_key), "ssh_user": sshd.user,
        "ssh_port": sshd.port, "root": str(tmp_path / "root"), "ec2_endpoint": fake.ec2_endpoint, "poll_s": 0.1,
        "down_timeout_s": 5, "regions": ["us-east-1"],
        "deadline_command": f"echo {{minutes}} > {tmp_path / 'shutdown-minutes'}", **kw,
    }), tmp_path / "state")


def run(fn: Any) -> Any:
    async def main() -> Any:
        async with open_asyncio_loop():
            return await fn()

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:  # the loop's nursery wraps what the call raised
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]  # type: ignore[assignment]
        raise group from None


def sky(fake: FakeSky, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(fake.command), *argv], capture_output=True, text=True, timeout=120)


def test_every_command_line_the_adapter_builds_is_parsed_by_skypilots_own_cli(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, sky_own: SkyOwn) -> None:
    c = cloud(tmp_path, sshd, fake)
    deadline = time.time() + 1800
    n = encode_name("sky", 1, 0, "0123abcd", deadline)

    async def go() -> None:
        [offer] = await c.offers(CandidateSpec(cloud="skypilot", gpu="A10G"), 0)
        machine = await c.launch(offer, n, deadline)
        await c.list_ours("ar-")
        await c.delete(machine.name, machine.id)

    run(go)
    fake.set_faults(launch="never")  # a launch that never ends is cancelled (api status -c, api cancel)
    stuck = cloud(tmp_path, sshd, fake, launch_timeout_s=1.5)
    with pytest.raises(LaunchAmbiguous):
        run(lambda: stuck.launch(Offer(cloud="skypilot", region="us-east-1", gpu="A10G", hourly_usd=1.0),
                                 encode_name("sky", 1, 1, "0123abcd", deadline), deadline))
    fake.set_faults(launch="never", old_cli=True)  # a CLI without `sky gpus`: show-gpus
    run(lambda: cloud(tmp_path, sshd, fake).offers(CandidateSpec(cloud="skypilot", gpu="T4"), 0))

    argvs = fake.argvs()
    parsed = sky_own.ask("parse", argvs, tmp_path / "home")
    assert [p.get("error") for p in parsed] == [None] * len(argvs), list(zip(argvs, parsed, strict=True))
    commands = {p["command"] for p in parsed}
    assert {"launch", "down", "status", "api status", "api cancel", "gpus list", "show-gpus"} <= commands
    [launch] = [p["params"] for p in parsed if p["command"] == "launch"][:1]
    # autodown once idle, but the cluster's own job keeps it busy until the machine's deadline
    assert (launch["down"], launch["idle_minutes_to_autostop"], launch["async_call"]) == (True, 15, True)
    assert launch["entrypoint"] == [hold_command(deadline)]
    assert (launch["cluster"], launch["infra"], launch["gpus"], launch["retry_until_up"]) == (
        n, "aws/us-east-1", "A10G:1", False)
    for p in parsed:
        if p["command"] == "api status":  # only the requests we made, or one cluster's active ones
            assert p["params"]["request_id_prefixes"] or p["params"]["cluster"], p
            assert p["params"]["limit"] == 50


def test_the_hold_command_is_bash_that_lasts_until_the_deadline(tmp_path: Path) -> None:
    started = time.time()
    done = subprocess.run(["bash", "-c", hold_command(started + 2)], timeout=30, check=False)
    assert done.returncode == 0
    assert time.time() >= started + 1.5  # to the whole second of the deadline, not at once


def test_the_fake_prints_what_skypilot_014_prints(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, sky_own: SkyOwn) -> None:
    """Each case: the fake's exit code, stdout and stderr are SkyPilot's own CLI code's, given the
    same answers (the fake's catalog and clusters)."""
    c = cloud(tmp_path, sshd, fake)
    n = encode_name("sky", 1, 0, "0123abcd", time.time() + 1800)
    run(lambda: c.launch(Offer(cloud="skypilot", region="us-east-1", gpu="A10G", hourly_usd=1.0), n,
                         time.time() + 1800))
    cases = [
        ["show-gpus", "T4:1", "--infra", "aws/us-east-1"],  # deprecated: stderr; one table per matching name
        ["gpus", "list", "A100:1", "--infra", "aws/us-east-1"],  # not sold singly: not found, exit 0
        ["gpus", "list", "L4:1", "--infra", "aws/us-west-2", "-o", "json"],  # L4 and L40S
        ["gpus", "list", "V100:1", "--infra", "aws/us-east-1"],
        ["down", "-y", "--async", "ar-nothere"],  # not found: exit 0
        ["status", "--ip", "ar-nothere"],  # exit 1
        ["down", "-y", "--async", n],
    ]
    catalog = [list(row) for row in CATALOG]
    clusters = [{"name": n, "handle": None, "status": "UP"}]
    for argv in cases:
        got = sky(fake, *argv)
        rid = re.search(r"request: (\S+)", got.stdout)
        want = sky_own.ask("cli", {"argv": argv, "catalog": catalog, "clusters": clusters,
                                       "request_id": rid.group(1) if rid else ""}, tmp_path / "home")
        assert (got.returncode, got.stdout, got.stderr) == (want["code"], want["out"], want["err"]), argv


def test_the_fakes_json_is_skypilots_own_models(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, sky_own: SkyOwn) -> None:
    c = cloud(tmp_path, sshd, fake)
    fake.set_faults(launch="never")  # a cluster being launched: INIT, nothing on the cloud yet
    n = encode_name("sky", 1, 0, "0123abcd", time.time() + 1800)
    launch = sky(fake, "launch", "--async", "-y", "-c", n, "--infra", "aws/us-east-1", "echo", "hi")
    assert launch.returncode == 0
    status = json.loads(sky(fake, "status", "-o", "json", "-u").stdout)
    assert [(s["name"], s["status"], s["cluster_name_on_cloud"], s["region"]) for s in status] == [
        (n, "INIT", None, None)]
    requests = json.loads(sky(fake, "api", "status", "-a", "-v", "-o", "json").stdout)
    assert sky_own.ask("models", {"status": status, "requests": requests}, tmp_path / "home") == []
    # the sweep lists a cluster with null fields (its region then from the EC2 tags, here none yet)
    assert [m.name for m in run(lambda: c.list_ours("ar-"))] == [n]
    fake.set_faults()
    for r in requests:
        sky(fake, "api", "cancel", "-y", r["request_id"])


def test_our_ssh_session_does_not_keep_a_cluster_busy_for_skypilots_autostop(
        tmp_path: Path, sshd: Sshd, sky_own: SkyOwn) -> None:
    """skylet counts an SSH session as activity only when it has a terminal under sshd: actor-run's
    connection has none (so the cluster needs a job of its own); `ssh -tt` has one, `ssh -T` not.
    The fake's skylet model gives the same answer as SkyPilot's function each time."""
    assert sshd.proc is not None
    pid = sshd.proc.pid  # the listener (`sshd -D`); its pid file may be half-written at this moment
    home = tmp_path / "home"

    def sleeps() -> set[int]:
        """The live `sleep` processes under sshd (a zombie's session has ended)."""
        found = set()
        for p in psutil.Process(pid).children(recursive=True):
            try:
                if p.name() == "sleep" and p.status() != psutil.STATUS_ZOMBIE:
                    found.add(p.pid)
            except psutil.NoSuchProcess:  # a session's short-lived process, gone meanwhile
                continue
        return found

    def no_sessions() -> None:
        """Until every session before has ended: sshd has no process under it (bounded)."""
        end = time.monotonic() + 30
        while psutil.Process(pid).children(recursive=True) and time.monotonic() < end:
            threading.Event().wait(0.05)
        assert psutil.Process(pid).children(recursive=True) == []

    def wait_session(what: str, client: subprocess.Popen[str] | None = None) -> None:
        """Until the session's own command runs (a `sleep` under sshd), or its client has exited
        (bounded); the ssh client's exit code and words say why it did not."""
        end = time.monotonic() + 30
        running = sleeps()
        while not running and time.monotonic() < end and (client is None or client.poll() is None):
            threading.Event().wait(0.1)
            running = sleeps()
        said = ""
        if client is not None and not running:
            client.kill()
            _, err = client.communicate(timeout=30)
            said = f": ssh exited {client.returncode}, said {err!r}"
        assert running, f"{what}: no `sleep` under sshd{said}; sshd's log: {sshd.log.read_text()[-2000:]!r}"

    def both() -> tuple[bool, bool]:
        return sky_own.ask("ssh", {"sshd_pid": pid}, home), has_active_ssh_sessions(pid)

    async def ours() -> tuple[bool, bool]:
        host = SSHHost("t", sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
                       known_hosts=tmp_path / "kh", loop=None)
        try:
            await host.run("true")
            async with trio.open_nursery() as nursery:  # a command running over our connection meanwhile
                nursery.start_soon(host.run, "sleep 20")
                await trio.to_thread.run_sync(wait_session, "actor-run's connection")
                answer = await trio.to_thread.run_sync(both)
                nursery.cancel_scope.cancel()
            return answer
        finally:
            await host.aclose()

    assert run(ours) == (False, False)
    sshd.kill_sessions()  # its `sleep` must not stand for the next session's
    for flag, want in (("-T", (False, False)), ("-tt", (True, True))):
        no_sessions()  # what kill_sessions ended is gone, not only signalled: a `sleep` now is this one's
        ssh = subprocess.Popen(["ssh", flag, *sshd.ssh_options(), f"{sshd.user}@{sshd.address}", "sleep 60"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_session(flag, ssh)
            assert both() == want, flag
        finally:
            ssh.kill()
            ssh.wait()
            sshd.kill_sessions()


def test_the_readme_names_the_key_where_skypilot_014_keeps_it(tmp_path: Path, sky_own: SkyOwn) -> None:
    path = sky_own.ask("key", {}, tmp_path / "home")
    assert path == "~/.sky/clients/<user hash>/ssh/sky-key"
    section = (ROOT / "README.md").read_text().split("## SkyPilot clusters on AWS", 1)[1].split("\n## ", 1)[0]
    assert f'ssh_key = "{path}"' in section


def test_the_test_command_makes_skypilots_venv_pinned() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert f"skypilot=={PIN}" in script
    assert "ACTOR_RUN_SKY_PYTHON" in script
    assert sys.executable  # the suite's own interpreter is not SkyPilot's
