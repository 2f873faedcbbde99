"""The sim cloud: offers and stock, injected failures, state outside the process, billing, real
sandboxes whose processes a delete or a preemption stops, and virtual machines."""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
import trio.testing

from actor_run.protocols.clouds import parse_settings
from actor_run.protocols.clouds.sim import (
    SimCloud,
    SimGpu,
    SimRegion,
    SimSettings,
    billed_seconds,
    billing,
    preempt_machine,
    set_fail_deletes,
    sim_machines,
)
from actor_run.protocols.clouds.simstore import FOLDER_LOOK_S
from actor_run.protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    MachineGone,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts.workspace import Launch, Workspace
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import CandidateSpec

FAST = {"launch_latency_s": 0.0, "delete_latency_s": 0.0}
TINY = [SimRegion(name="r", gpus={"A100": SimGpu(stock=1, hourly_usd=1.0)})]
FIVE = [SimRegion(name="r", gpus={"A100": SimGpu(stock=5, hourly_usd=1.0)})]


def make(tmp_path: Path, **kw: Any) -> SimCloud:
    return SimCloud(SimSettings(**{**FAST, **kw}), tmp_path)


def processes_under(path: Path) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(path) in part for part in proc.info["cmdline"] or []):
            out.append(proc.pid)
    return out


@pytest.fixture(autouse=True)
def leaves_nothing_behind(tmp_path: Path) -> Iterator[None]:
    yield
    assert sim_machines((tmp_path / "sim").resolve()) == []
    assert processes_under(tmp_path.resolve()) == []


def run(fn: Callable[[], Awaitable[None]], clock: trio.abc.Clock | None = None) -> None:
    trio.run(fn, clock=clock)


async def cleanup(cloud: SimCloud, *names: str) -> None:
    with trio.CancelScope(shield=True):
        for name in names:
            await cloud.delete(name)


@asynccontextmanager
async def job_on_a_machine(cloud: SimCloud) -> AsyncIterator[tuple[Machine, Workspace, str, int]]:
    """Machine "m-1", connected, with a job started in its work folder; deleted afterwards."""
    m = await cloud.launch(place(), "m-1", 0)
    try:
        ws = await cloud.connect(m)
        work = ws.work_dir("j", 0, 0)
        yield m, ws, work, await ws.start(job(work))
    finally:
        await cleanup(cloud, m.name)


def place(region: str = "us-east", gpu: str = "A100") -> Offer:
    return Offer(cloud="sim", region=region, gpu=gpu)


def job(work: str, command: str = "x") -> Launch:
    return Launch(work=work, command=command, code=None, inputs=[], env={}, lost_after_s=60.0)


def is_private_dir(path: Path) -> bool:
    return path.is_dir() and path.stat().st_mode & 0o777 == 0o700


# --- settings ------------------------------------------------------------------------------------


def test_settings_defaults_and_rate_checks(tmp_path: Path) -> None:
    s = parse_settings("sim", {})
    assert {r.name for r in s.regions} == {"us-east", "eu-west", "ap-south"}
    assert SimCloud(s, tmp_path).dir == (tmp_path / "sim").resolve()
    with pytest.raises(SpecError, match=r"sim\.preempt_rate: expected number between 0 and 1, got 1.5"):
        parse_settings("sim", {"preempt_rate": 1.5})
    with pytest.raises(SpecError, match=r"clouds\.sim\.bogus"):
        parse_settings("sim", {"bogus": 1})
    own = parse_settings("sim", {"state_dir": str(tmp_path / "elsewhere")})
    assert SimCloud(own, tmp_path).dir == (tmp_path / "elsewhere").resolve()


# --- offers and stock ----------------------------------------------------------------------------


def test_offers_filter_by_region_gpu_and_price_cheapest_first(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        every = await cloud.offers(CandidateSpec(cloud="sim"), 0)
        assert [(o.region, o.gpu) for o in every][:2] == [("ap-south", "A100"), ("us-east", "A100")]
        assert [o.hourly_usd for o in every] == sorted(o.hourly_usd for o in every)
        h100 = await cloud.offers(CandidateSpec(cloud="sim", gpu="h100"), 3)
        assert [(o.region, o.gpu, o.candidate) for o in h100] == [
            ("us-east", "H100", 3), ("eu-west", "H100", 3),
        ]
        eu = await cloud.offers(CandidateSpec(cloud="sim", regions=["eu-west"], max_hourly_usd=3.0), 1)
        assert [(o.region, o.gpu, o.hourly_usd) for o in eu] == [("eu-west", "A100", 2.1)]
        assert await cloud.offers(CandidateSpec(cloud="sim", gpu="B200"), 0) == []

    run(main)


def test_stock_is_held_by_existing_machines(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, regions=TINY)
    a100 = CandidateSpec(cloud="sim", gpu="A100")

    async def main() -> None:
        m = await cloud.launch(place("r"), "m-1", 0)
        try:
            assert await cloud.offers(a100, 0) == []
            with pytest.raises(LaunchRefused) as refused:
                await cloud.launch(place("r"), "m-2", 0)
            assert refused.value.code == Code.NO_CAPACITY
        finally:
            await cleanup(cloud, m.name)
        assert len(await cloud.offers(a100, 0)) == 1

    run(main)


def test_stock_is_counted_again_when_its_file_is_lost(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, regions=TINY)

    async def main() -> None:
        m = await cloud.launch(place("r"), "m-1", 0)
        try:
            (cloud.dir / "held.json").unlink()
            with pytest.raises(LaunchRefused):
                await cloud.launch(place("r"), "m-2", 0)
        finally:
            await cleanup(cloud, m.name)
        assert len(await cloud.offers(CandidateSpec(cloud="sim"), 0)) == 1

    run(main)


def test_concurrent_launches_never_exceed_stock(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, regions=FIVE)
    won: list[str] = []
    refused: list[Code] = []

    async def one(i: int) -> None:
        try:
            won.append((await cloud.launch(place("r"), f"m-{i:02d}", 0)).name)
        except LaunchRefused as exc:
            refused.append(exc.code)

    async def main() -> None:
        try:
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
            assert len(won) == 5
            assert refused == [Code.NO_CAPACITY] * 15
            assert sorted(won) == sim_machines(cloud.dir)
        finally:
            await cleanup(cloud, *won)

    run(main)


def test_launches_wait_their_latency_on_one_timer(tmp_path: Path) -> None:
    """Fifty launches at once: each machine is made `launch_latency_s` after it was asked for, never
    sooner, while the launches wait on the create batch's one timer: one deadline in trio's heap, not
    a sleep (a cancel scope, a deadline and its expiry) per launch (bench/RESULTS.md, item 56)."""
    cloud = make(tmp_path, virtual=True, launch_latency_s=0.3,
                 regions=[SimRegion(name="r", gpus={"A100": SimGpu(stock=50, hourly_usd=1.0)})])
    made: list[Machine] = []
    waited: list[float] = []
    timed: list[int] = []

    async def one(i: int) -> None:
        asked, asked_at = trio.current_time(), time.time()
        m = await cloud.launch(place("r"), f"m-{i:02d}", 0)
        waited.append(trio.current_time() - asked)
        assert m.created_at >= asked_at + 0.3
        made.append(m)

    async def main() -> None:
        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(50):
                        nursery.start_soon(one, i)
                    await trio.testing.wait_all_tasks_blocked()  # every launch waits its latency now
                    timed.append(sum(1 for o in gc.get_objects()
                                     if isinstance(o, trio.CancelScope) and o.deadline < math.inf))
        finally:
            await cleanup(cloud, *(m.name for m in made))

    run(main)
    assert len(made) == 50
    assert min(waited) >= 0.3
    assert timed == [2]  # this test's fail_after and the batch's timer (main: 51, a sleep per launch)


# --- injected launch failures ----------------------------------------------------------------------


def test_no_capacity_refuses_cleanly_and_leaves_no_machine(tmp_path: Path) -> None:
    cloud = make(tmp_path, no_capacity_rate=1.0)

    async def main() -> None:
        with pytest.raises(LaunchRefused) as refused:
            await cloud.launch(place(), "m-1", 0)
        assert refused.value.code == Code.NO_CAPACITY
        assert await cloud.list_ours("") == []
        assert not (cloud.dir / "sandboxes" / "m-1").exists()

    run(main)


def test_launch_failure_refuses_cleanly(tmp_path: Path) -> None:
    cloud = make(tmp_path, launch_failure_rate=1.0)

    async def main() -> None:
        with pytest.raises(LaunchRefused) as refused:
            await cloud.launch(place(), "m-1", 0)
        assert refused.value.code == Code.LAUNCH_FAILED
        assert sim_machines(cloud.dir) == []

    run(main)


def test_ambiguous_create_leaves_a_machine_to_reconcile_by_name(tmp_path: Path) -> None:
    cloud = make(tmp_path, ambiguous_rate=1.0)

    async def main() -> None:
        try:
            with pytest.raises(LaunchAmbiguous) as ambiguous:
                await cloud.launch(place(), "ar-x-m-1", 0)
            assert ambiguous.value.code == Code.AMBIGUOUS_CREATE
            assert [m.name for m in await cloud.list_ours("ar-x-")] == ["ar-x-m-1"]
            assert await cloud.list_ours("ar-y-") == []
        finally:
            await cleanup(cloud, "ar-x-m-1")
        assert await cloud.list_ours("ar-") == []
        assert not (cloud.dir / "sandboxes" / "ar-x-m-1").exists()

    run(main)


def test_a_taken_name_is_ambiguous(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True)

    async def main() -> None:
        await cloud.launch(place(), "m-1", 0)
        try:
            with pytest.raises(LaunchAmbiguous, match="exists already"):
                await cloud.launch(place(), "m-1", 0)
        finally:
            await cleanup(cloud, "m-1")

    run(main)


def test_a_seed_makes_fates_a_function_of_the_name(tmp_path: Path) -> None:
    many = [SimRegion(name="r", gpus={"A100": SimGpu(stock=100, hourly_usd=1.0)})]
    names = [f"m-{i}" for i in range(30)]

    async def launched(cloud: SimCloud, order: list[str]) -> set[str]:
        won = set()
        for name in order:
            try:
                won.add((await cloud.launch(place("r"), name, 0)).name)
            except LaunchRefused:
                continue
        await cleanup(cloud, *won)
        return won

    async def main() -> None:
        kw: dict[str, Any] = {"seed": 7, "no_capacity_rate": 0.5, "regions": many, "virtual": True}
        a = await launched(make(tmp_path / "a", **kw), names)
        b = await launched(make(tmp_path / "b", **kw), names[::-1])
        assert a == b
        assert 0 < len(a) < len(names)

    run(main)


def test_a_boot_failure_never_answers(tmp_path: Path) -> None:
    cloud = make(tmp_path, boot_failure_rate=1.0)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            with pytest.raises(Unreachable, match="does not answer"):
                await cloud.connect(m)
        finally:
            await cleanup(cloud, m.name)

    run(main)


# --- delete, outages, state outside the process, billing -----------------------------------------


def test_delete_is_idempotent(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        await cloud.delete("never-was")
        m = await cloud.launch(place(), "m-1", 0)
        await cloud.delete(m.name, m.id)
        await cloud.delete(m.name, m.id)
        assert sim_machines(cloud.dir) == []
        assert len(billing(cloud.dir)) == 1

    run(main)


def test_an_outage_keeps_the_machine_until_deletes_work_again(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            set_fail_deletes(cloud.dir, True)
            with pytest.raises(DeleteUnconfirmed, match="injected"):
                await cloud.delete(m.name)
            assert sim_machines(cloud.dir) == ["m-1"]
            assert (cloud.dir / "sandboxes" / "m-1").is_dir()
        finally:
            set_fail_deletes(cloud.dir, False)
            await cleanup(cloud, m.name)
        assert sim_machines(cloud.dir) == []

    run(main)


def test_a_second_instance_sees_the_first_ones_machines(tmp_path: Path) -> None:
    first, second = make(tmp_path), make(tmp_path)

    async def main() -> None:
        m = await first.launch(place(), "m-1", 123.0)
        try:
            assert await second.list_ours("m-") == [m]
            offers = await second.offers(CandidateSpec(cloud="sim", gpu="A100", regions=["us-east"]), 0)
            assert len(offers) == 1
            with pytest.raises(LaunchAmbiguous):
                await second.launch(place(), "m-1", 0)
        finally:
            await cleanup(second, m.name)
        assert await first.list_ours("") == []

    run(main)


def test_another_process_shares_the_cloud(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True)
    script = textwrap.dedent(f"""
        import trio
        from pathlib import Path
        from actor_run.protocols.clouds.sim import SimCloud, SimSettings
        from actor_run.protocols.messages import Offer
        cloud = SimCloud(SimSettings(virtual=True, launch_latency_s=0), Path({str(tmp_path)!r}))
        trio.run(cloud.launch, Offer(cloud="sim", region="eu-west", gpu="H100"), "m-other", 0.0)
    """)
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=root, env=env)

    async def main() -> None:
        try:
            [m] = await cloud.list_ours("")
            assert (m.name, m.region, m.gpu) == ("m-other", "eu-west", "H100")
        finally:
            await cleanup(cloud, "m-other")

    run(main)


def test_billing_records_machine_seconds(tmp_path: Path) -> None:
    cloud = make(tmp_path, delete_latency_s=0.01, virtual=True)

    async def main() -> None:
        machines = [await cloud.launch(place(), f"m-{i}", 0) for i in range(3)]
        asked = {}
        for m in machines:
            asked[m.name] = time.time()
            await cloud.delete(m.name)
        lines = billing(cloud.dir)
        assert sorted(line.name for line in lines) == ["m-0", "m-1", "m-2"]
        for line in lines:
            assert 0 < line.seconds < 30
            # billed up to the delete request, not to its confirmation 10 ms later
            assert asked[line.name] <= line.deleted_at < asked[line.name] + 0.01
            assert line.usd == pytest.approx(line.seconds * 1.8 / 3600)
            assert not line.preempted
        assert billed_seconds(cloud.dir) == pytest.approx(sum(line.seconds for line in lines))

    run(main)


# --- real sandboxes ------------------------------------------------------------------------------


def sleeper(ws: Workspace) -> Launch:
    return job(ws.work_dir("j", 0, 0), "sleep 30")


def test_delete_stops_the_jobs_and_removes_the_sandbox(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        sandbox = Path(m.root)
        try:
            assert is_private_dir(sandbox)
            ws = await cloud.connect(m)
            try:
                pid = await ws.start(sleeper(ws))
                assert (await ws.poll(ws.work_dir("j", 0, 0), pid, 0, 0)).state == "running"
                assert processes_under(sandbox) != []
            finally:
                await ws.aclose()
        finally:
            await cleanup(cloud, m.name)
        assert processes_under(sandbox) == []
        assert not is_private_dir(sandbox)

    run(main)


def test_a_machine_preempted_at_launch_is_gone_at_connect(tmp_path: Path) -> None:
    cloud = make(tmp_path, preempt_rate=1.0, preempt_within_s=0.0)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            with pytest.raises(MachineGone, match="sim: m-1 was preempted"):
                await cloud.connect(m)
            assert [x.name for x in await cloud.list_ours("m-")] == ["m-1"]
        finally:
            await cleanup(cloud, m.name)
        [line] = billing(cloud.dir)
        assert line.preempted

    run(main)


def test_a_preemption_stops_the_job_and_every_later_host_call_raises(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            ws = await cloud.connect(m)
            try:
                pid = await ws.start(sleeper(ws))
                assert preempt_machine(cloud.dir, m.name)
                assert processes_under(Path(m.root)) == []
                with pytest.raises(MachineGone, match="was preempted"):
                    await ws.poll(ws.work_dir("j", 0, 0), pid, 0, 0)
                with pytest.raises(MachineGone):
                    await ws.beat(ws.work_dir("j", 0, 0))
            finally:
                await ws.aclose()
        finally:
            await cleanup(cloud, m.name)

    run(main)


def test_a_deleted_machine_is_gone_for_its_workspace(tmp_path: Path) -> None:
    cloud = make(tmp_path)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            ws = await cloud.connect(m)
            try:
                await make(tmp_path).delete(m.name)  # say, a sweep by another controller
                with pytest.raises(MachineGone, match="deleted"):
                    await ws.beat(ws.work_dir("j", 0, 0))
            finally:
                await ws.aclose()
        finally:
            await cleanup(cloud, m.name)

    run(main)


# --- virtual machines ----------------------------------------------------------------------------


def test_a_virtual_job_runs_to_its_exit_with_progress(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, virtual_job_s=10.0)
    clock = trio.testing.MockClock()
    code = tmp_path / "code.bin"
    code.write_bytes(b"x" * 1000)

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            ws = await cloud.connect(m)
            assert await ws.publish_code(code, "abc", "t0") == 1000
            assert await ws.publish_code(code, "abc", "t1") == 0
            work = ws.work_dir("j", 0, 0)
            pid = await ws.start(Launch(work=work, command="train", code="abc", inputs=[], env={},
                                        lost_after_s=60))
            p_at = l_at = 0
            states, lines = [], []
            for jump in (1.0, 1.0, 10.0):
                clock.jump(jump)
                r = await ws.poll(work, pid, p_at, l_at)
                assert (r.progress_size, r.log_size) == (p_at + len(r.progress), l_at + len(r.log))
                p_at, l_at = r.progress_size, r.log_size
                states.append((r.state, r.exit_code))
                lines += [json.loads(x) for x in r.progress.splitlines()]
            assert states == [("running", None), ("running", None), ("exited", 0)]
            assert lines == [{"stage": "train", "step": k} for k in (1, 2, 3)]
            assert await ws.fetch(work, tmp_path / "got") > 0
            assert not (tmp_path / "got" / "response.json").exists()  # the exit code came with the poll
            assert (tmp_path / "got" / "out" / "result.txt").is_file()
            await ws.remove(work)
            assert (await ws.poll(work, pid, 0, 0)).state == "gone"
        finally:
            await cleanup(cloud, m.name)
        assert not (cloud.dir / "sandboxes").exists()

    run(main, clock=clock)


def test_a_virtual_job_holds_only_what_was_not_read(tmp_path: Path) -> None:
    """A virtual job's output lives in the controller's memory: what a poll read is let go of (a 300 s
    job polled every 0.5 s wrote 32 KiB, half a load test's RSS per attempt), and a read from an
    earlier offset still gets all of it."""
    cloud = make(tmp_path, virtual=True, virtual_job_s=1000.0)
    clock = trio.testing.MockClock()

    async def main() -> None:
        async with job_on_a_machine(cloud) as (_, ws, work, pid):
            p_at = l_at = 0
            for _ in range(200):
                clock.jump(1.0)
                r = await ws.poll(work, pid, p_at, l_at)
                p_at, l_at = r.progress_size, r.log_size
            held = cloud._virtual["m-1"].jobs[work]
            assert len(held.progress) + len(held.log) < 100  # the last poll's lines (main: 200 polls', 10 KiB)
            r = await ws.poll(work, pid, 0, 0)  # from the start: all 201 steps
            assert [json.loads(x) for x in r.progress.splitlines()] == [{"stage": "train", "step": k}
                                                                        for k in range(1, 202)]
            assert r.log.splitlines() == [b"virtual train step %d" % k for k in range(1, 202)]
            assert (len(r.progress), len(r.log)) == (r.progress_size, r.log_size)
            await ws.stop(work)
            r = await ws.poll(work, pid, 0, l_at)  # the log's exit line follows what was read
            assert (r.state, r.exit_code, r.log) == ("exited", 143, b"virtual train step 201\nvirtual job exited 143\n")
            assert len(r.progress) == r.progress_size

    run(main, clock=clock)


def test_a_virtual_job_says_when_it_may_have_exited(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, virtual_job_s=10.0)
    clock = trio.testing.MockClock(autojump_threshold=0)  # time jumps whenever every task waits

    async def main() -> None:
        async with job_on_a_machine(cloud) as (_, ws, work, pid):
            began = trio.current_time()
            with trio.move_on_after(9.5):
                await ws.wait_exit(work, pid)
                raise AssertionError("wait_exit returned before the job's time was up")
            with trio.fail_after(1):
                await ws.wait_exit(work, pid)
            assert trio.current_time() - began == pytest.approx(10.0)
            assert (await ws.poll(work, pid, 0, 0)).state == "exited"
            await ws.wait_exit(work, pid)  # ended already: at once
            await ws.wait_exit(work, pid + 1)  # not the job named: at once (the poll says lost)
            assert trio.current_time() - began == pytest.approx(10.0)

    run(main, clock=clock)


def test_a_stopped_virtual_job_exits_143(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True, virtual_job_s=100.0, virtual_exit_code=3)

    async def main() -> None:
        async with job_on_a_machine(cloud) as (_, ws, work, pid):
            await ws.beat(work)
            await ws.stop(work)
            r = await ws.poll(work, pid, 0, 0)
            assert (r.state, r.exit_code) == ("exited", 143)
            assert (await ws.poll(work, pid + 1, 0, 0)).state == "lost"

    run(main)


def test_a_preempted_virtual_machine_is_gone(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True)

    async def main() -> None:
        async with job_on_a_machine(cloud) as (m, ws, work, pid):
            preempt_machine(cloud.dir, m.name)
            with pytest.raises(MachineGone, match="sim: m-1 was preempted"):
                await ws.poll(work, pid, 0, 0)

    run(main)


def test_machines_are_plain_machines(tmp_path: Path) -> None:
    cloud = make(tmp_path, virtual=True)

    async def main() -> None:
        m = await cloud.launch(place("eu-west", "H100"), "m-1", 99.0)
        try:
            assert type(m) is Machine
            assert (m.cloud, m.region, m.gpu, m.hourly_usd) == ("sim", "eu-west", "H100", 3.2)
            assert (m.deadline, m.address, m.root) == (99.0, "localhost", "/sim-virtual/m-1")
            assert await cloud.list_ours("m-1") == [m]
        finally:
            await cleanup(cloud, m.name)

    run(main)


def stats_of_records() -> tuple[list[str], Callable[..., os.stat_result]]:
    """An `os.stat` to patch in that notes each look at a machine's record (a .json), and the list."""
    seen: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        if str(path).endswith(".json"):
            seen.append(str(path))
        return real_stat(path, *args, **kw)

    return seen, counting_stat


async def polled_until_gone(ws: Workspace, work: str, pid: int) -> None:
    """Poll until the guard says the machine is gone (within 5 s)."""
    with trio.fail_after(5):
        while True:
            try:
                await ws.poll(work, pid, 0, 0)
            except MachineGone:
                return
            await trio.sleep(0.01)


def test_guards_share_one_look_at_an_unchanged_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While no record was replaced or removed, a poll makes no system call on its machine's record:
    10,000 jobs polled every 0.5 s made 20,000 `stat`s a second. A change by anyone (here another
    store deletes the machine) is still seen."""
    cloud = make(tmp_path, virtual=True, virtual_job_s=100.0)
    record_stats, counting_stat = stats_of_records()

    async def main() -> None:
        m = await cloud.launch(place(), "m-1", 0)
        try:
            ws = await cloud.connect(m)  # its first call looks at the record against the folder's stamp
            work = ws.work_dir("j", 0, 0)
            pid = await ws.start(job(work))
            monkeypatch.setattr(os, "stat", counting_stat)
            for _ in range(100):
                assert (await ws.poll(work, pid, 0, 0)).state == "running"
            assert record_stats == []
            await make(tmp_path).delete(m.name)  # say, a sweep by another controller
            await polled_until_gone(ws, work, pid)  # seen once the shared look is renewed (FOLDER_LOOK_S)
            assert record_stats  # the moved count sent the guard back to its record
        finally:
            monkeypatch.undo()
            await cleanup(cloud, m.name)

    run(main)


def test_a_burst_of_creates_costs_the_guards_no_look_at_their_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Launches add records and change none: a machine polled while 50 others are made (a start
    burst) makes no system call on its record (the folder's mtime, the old sign, moved with each
    create, and every guard `stat`ed its record at every poll of the burst). A preemption by another
    store, a change to an existing record, is seen."""
    cloud = make(tmp_path, virtual=True, virtual_job_s=100.0,
                 regions=[SimRegion(name="us-east", gpus={"A100": SimGpu(stock=60, hourly_usd=1.8)})])
    record_stats, counting_stat = stats_of_records()

    async def main() -> None:
        m = await cloud.launch(place(), "m-0", 0)
        others: list[str] = []
        try:
            ws = await cloud.connect(m)
            work = ws.work_dir("j", 0, 0)
            pid = await ws.start(job(work))
            monkeypatch.setattr(os, "stat", counting_stat)
            for i in range(1, 51):
                others.append((await cloud.launch(place(), f"m-{i}", 0)).name)
                assert (await ws.poll(work, pid, 0, 0)).state == "running"
                await trio.sleep(FOLDER_LOOK_S / 5)  # the shared look is renewed now and then meanwhile
            assert [p for p in record_stats if p.endswith("/m-0.json")] == []
            preempt_machine(cloud.dir, m.name)  # another store: a change to an existing record
            await polled_until_gone(ws, work, pid)  # seen once the look is renewed
        finally:
            monkeypatch.undo()
            for name in [m.name, *others]:
                await cleanup(cloud, name)

    run(main)


def test_this_processs_deletes_of_other_machines_cost_a_guard_no_look_at_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An end burst: other machines deleted through this process (any of its stores) move no other
    guard's stamp, so a machine polled meanwhile makes no system call on its record (while the
    count alone was the sign, every guard `stat`ed its record at every poll of the burst). A delete
    of this machine by another process is still seen."""
    cloud = make(tmp_path, virtual=True, virtual_job_s=100.0,
                 regions=[SimRegion(name="us-east", gpus={"A100": SimGpu(stock=60, hourly_usd=1.8)})])
    record_stats, counting_stat = stats_of_records()
    others = [f"m-{i}" for i in range(1, 41)]
    script = textwrap.dedent(f"""
        import trio
        from pathlib import Path
        from actor_run.protocols.clouds.sim import SimCloud, SimSettings
        cloud = SimCloud(SimSettings(virtual=True), Path({str(tmp_path)!r}))
        trio.run(cloud.delete, "m-0")
    """)
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}

    async def main() -> None:
        m = await cloud.launch(place(), "m-0", 0)
        try:
            for name in others:
                await cloud.launch(place(), name, 0)
            ws = await cloud.connect(m)
            work = ws.work_dir("j", 0, 0)
            pid = await ws.start(job(work))
            monkeypatch.setattr(os, "stat", counting_stat)
            second = make(tmp_path)  # another store of this process shares what it changed
            for i, name in enumerate(others):
                await (cloud if i % 2 else second).delete(name)
                assert (await ws.poll(work, pid, 0, 0)).state == "running"
            assert [p for p in record_stats if p.endswith("/m-0.json")] == []
            await trio.to_thread.run_sync(functools.partial(subprocess.run, [sys.executable, "-c", script],
                                                            check=True, cwd=root, env=env))
            await polled_until_gone(ws, work, pid)  # seen once the shared look is renewed (FOLDER_LOOK_S)
            assert [p for p in record_stats if p.endswith("/m-0.json")]  # the other process's change was looked at
        finally:
            monkeypatch.undo()
            for name in ["m-0", *others]:
                await cleanup(cloud, name)

    run(main)
