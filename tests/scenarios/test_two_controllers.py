"""Two controllers on one cloud never hurt each other (real `actor-run` processes, each with its
own ledger, on the `local` cloud and on one `sim` folder): a sweep from a ledger that does not
know an owner keeps that owner's machines (foreign) until the deadline rule or the machine's own
heartbeat stamp proves them abandoned."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.cli_inproc import CLI, run_cli
from support.waits import poll

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.supervisors.ledger import Ledger

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

# reports progress until the test creates $RELEASE (bounded: 4 minutes), then writes its output
JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
for step in range(1200):
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n")
    progress.flush()
    if os.path.exists(os.environ["RELEASE"]):
        break
    time.sleep(0.2)  # the job's own work: a step takes this long
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "done.txt"), "w").write(os.environ["ACTOR_RUN_SEED"])
'''


class World:
    """A folder of state (the clouds' machines) shared by controllers with ledgers of their own."""

    def __init__(self, tmp: Path, cloud: str) -> None:
        self.tmp, self.cloud = tmp, cloud
        self.state = tmp / "state"
        self.release = tmp / "release"
        (tmp / "code").mkdir()
        (tmp / "code" / "job.py").write_text(JOB)
        self.sim = {"launch_latency_s": 0.0, "delete_latency_s": 0.0, "state_dir": str(tmp / "sim")}

    def batch(self, name: str, *, timeout_s: int = 120, setup_grace_s: int = 60, margin_s: int = 900,
              lost_after_s: int = 300, seeds: int = 2) -> Path:
        place = '[[candidates]]\ncloud = "sim"\ngpu = "A100"\n\n[clouds.sim]\n' + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in self.sim.items()) if self.cloud == "sim" else (
            '[[candidates]]\ncloud = "local"\n')
        path = self.tmp / f"{name}.toml"
        path.write_text(f"""
[job]
name = "{name}"
command = "python3 job.py"
code = "code"
seeds = {list(range(1, seeds + 1))}
timeout_s = {timeout_s}
env = {{ RELEASE = "{self.release}" }}
public_env = ["RELEASE"]  # a resumer reads it from the ledger

[policy]
poll_s = 0.2
setup_grace_s = {setup_grace_s}
stall_after_s = 120
lost_after_s = {lost_after_s}
deadline_margin_s = {margin_s}
max_attempts = 1
concurrency = {seeds}

{place}""")
        return path

    def ledger(self, name: str) -> Path:
        return self.tmp / f"{name}.sqlite"

    def machines(self) -> list[str]:
        if self.cloud == "sim":
            return sorted(sim_machines(self.tmp / "sim"))
        return sorted(p.stem for p in (self.state / "local").glob("ar-*.json"))

    def sweep(self, ledger: str, *extra: str) -> list[dict[str, Any]]:
        """`actor-run sweep --json` with ledger `ledger` (one that has heard of this world's clouds)."""
        path = self.ledger(ledger)
        if self.cloud == "sim" and not path.exists():  # the sim's folder is in its settings: a ledger that used it
            led = Ledger(path, uuid.uuid4().hex)
            led.record_cloud("sim", self.sim)
            led.close()
        done = run_cli(["sweep", "--json", "--ledger", str(path), "--state-dir", str(self.state), *extra],
                              timeout=120, env=ENV, cwd=self.tmp)
        assert done.returncode == 0, done.stdout + done.stderr
        return [json.loads(x) for x in done.stdout.splitlines()]


class Controller:
    """`actor-run run --json` in a process of its own; its events read on a thread (a full pipe
    would stall it)."""

    def __init__(self, world: World, batch: Path, ledger: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, "run", str(batch), "--json", "--out", str(world.tmp / "out"), "--ledger", str(world.ledger(ledger)),
             "--state-dir", str(world.state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=world.tmp, env=ENV)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def wait_for(self, kind: str, count: int, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while sum(e["type"] == kind for e in self.seen) < count:
            left = end - time.monotonic()
            assert left > 0, f"{count} {kind} not seen in {timeout} s: {[e['type'] for e in self.seen][-20:]}"
            try:
                self.seen.append(self.events.get(timeout=left))
            except queue.Empty:
                continue

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        while not self.events.empty():
            self.seen.append(self.events.get_nowait())
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.finish(30)

    def owner(self) -> str:
        """Its short owner id, as its machines' names carry it."""
        leased = [e for e in self.seen if e["type"] == "LeaseRequested"]
        return str(leased[0]["name"].split("-")[-2])


def stop_all(*controllers: Controller) -> None:
    for c in controllers:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGINT)
    for c in controllers:
        c.finish()


@pytest.mark.parametrize("cloud", ["local", "sim"])
def test_two_controllers_finish_and_a_third_ledger_lists_their_machines_as_foreign(tmp_path: Path,
                                                                                    cloud: str) -> None:
    world = World(tmp_path, cloud)
    a = Controller(world, world.batch("alpha"), "a")
    b = None
    try:
        a.wait_for("JobStarted", 2)
        b = Controller(world, world.batch("beta"), "b")  # its start-up sweep meets alpha's running machines
        b.wait_for("JobStarted", 2)
        a.wait_for("Progress", 10)
        assert len(world.machines()) == 4
        swept = world.sweep("c")
        ours = {d["machine"]: d for d in swept if d["machine"] != "*"}
        assert set(ours) == set(world.machines())
        assert {(d["action"], d["reason"]) for d in ours.values()} == {("keep", "foreign owner")}
        assert {d["owner"] for d in ours.values()} == {a.owner(), b.owner()}
        assert all(d["expires"] == d["deadline"] + 600 > time.time() for d in ours.values())
        world.release.touch()
        assert (a.finish(), b.finish()) == (0, 0)
    finally:
        stop_all(*(c for c in (a, b) if c is not None))
    for c in (a, b):
        assert c is not None
        ends = [e for e in c.seen if e["type"] == "JobEnded"]
        assert [(e["outcome"], e["attempts"]) for e in ends] == [("succeeded", 1)] * 2  # nothing interrupted
        assert not [e for e in c.seen if e["type"] in ("Stalled", "Retrying", "LeaseFailed")]
    for name in ("alpha", "beta"):
        for seed in (1, 2):
            # each controller's run has its own folder under out/ (latest names one of them)
            found = [p for p in (tmp_path / "out").glob(f"*/{name}/seed-{seed}/out/done.txt")
                     if p.parts[-5] != "latest"]
            assert [p.read_text() for p in found] == [str(seed)]
    assert world.machines() == []


def test_killed_controllers_machines_stay_until_their_deadline_then_any_ledger_deletes_them(tmp_path: Path) -> None:
    world = World(tmp_path, "local")
    # test-sized deadlines: launch + timeout_s + setup_grace_s + margin, about 15 s away
    a = Controller(world, world.batch("alpha", timeout_s=10, setup_grace_s=4, margin_s=1), "a")
    b = Controller(world, world.batch("beta", timeout_s=10, setup_grace_s=4, margin_s=1), "b")
    try:
        a.wait_for("JobStarted", 2)
        b.wait_for("JobStarted", 2)
    finally:
        a.kill()
        b.kill()
    machines = world.machines()
    assert len(machines) == 4
    kept = world.sweep("c", "--grace", "0")
    assert {(d["machine"], d["action"], d["reason"]) for d in kept} == {
        (m, "keep", "foreign owner") for m in machines}
    assert world.machines() == machines
    deadline = max(d["deadline"] for d in kept)
    poll(lambda: time.time() > deadline + 1, 60, "the machines' deadline", every=0.2)  # the clock is the condition
    swept = world.sweep("c", "--grace", "0")
    assert {(d["machine"], d["action"], d["reason"]) for d in swept} == {
        (m, "deleted", "past its deadline") for m in machines}
    assert world.machines() == []


def test_a_killed_controllers_machine_goes_once_its_host_stamp_is_older_than_lost_after(tmp_path: Path) -> None:
    world = World(tmp_path, "local")
    lost = 12
    a = Controller(world, world.batch("alpha", lost_after_s=lost, seeds=1), "a")
    try:
        a.wait_for("JobStarted", 1)
        a.wait_for("Progress", 3)
    finally:
        a.kill()
    [machine] = world.machines()
    [alive] = (world.state / "local" / machine / "work").glob("*/*/a0/alive")
    stamp = int(alive.read_text())
    early = world.sweep("c")
    assert time.time() - stamp < lost  # the sweep read the stamp inside its window (a slow machine: raise `lost`)
    assert [(d["machine"], d["action"], d["reason"]) for d in early] == [(machine, "keep", "foreign owner")]
    assert world.machines() == [machine]
    poll(lambda: time.time() - stamp > lost + 1, 60, "the host's stamp to age past lost_after_s", every=0.2)
    swept = world.sweep("c")
    assert [(d["machine"], d["action"]) for d in swept] == [(machine, "deleted")]
    assert "heartbeat on the host stopped" in swept[0]["reason"]
    assert world.machines() == []
