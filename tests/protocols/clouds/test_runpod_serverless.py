"""The runpod-serverless cloud against a fake RunPod on loopback (REST v2 held to RunPod's OpenAPI
document, the queue API to the contract), whose workers run actor-run's own handler under RunPod's
own SDK worker loop (runpod 1.12.0) in a process each: offers, launch, a queue job run for real,
fetch, delete, each fault the contract names, and what the worker does under the SDK (failures
classified wherever the SDK puts the marker, a cancel or SIGTERM that stops the command, chunks
under the stream limit)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from fakes.runpod_serverless import FakeRunPodServerless, serving, settings

from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.clouds.runpod_serverless import ServerlessCloud
from actor_run.protocols.failures import Code, LaunchRefused, MachineGone, Refused, SpecError
from actor_run.protocols.hosts.workspace import Launch, PollResult
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.serverless import OUT_INLINE_LIMIT
from actor_run.protocols.specs import CandidateSpec


@pytest.fixture
def fake(tmp_path: Path, runpod_zygote: Any) -> Iterator[FakeRunPodServerless]:
    with serving(tmp_path / "fake") as server:
        yield server



@pytest.fixture
def cloud_of(fake: FakeRunPodServerless, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RP_TEST_KEY", "test-key")

    def make(**extra: Any) -> ServerlessCloud:
        c = make_cloud("runpod-serverless", settings(fake, **extra), tmp_path / "state")
        assert isinstance(c, ServerlessCloud)
        return c

    return make


DEADLINE = int(time.time() + 3600)


def name(n: int = 1) -> str:
    return f"ar-t-{n}-a0-0123abcd-d{DEADLINE}"


def launch_of(work: str, command: str, **kw: Any) -> Launch:
    return Launch(work=work, command=command, code=None, inputs=[], env={"ACTOR_RUN_SEED": "7"}, lost_after_s=30,
                  **kw)


async def run_until_end(ws: Any, work: str, limit_s: float = 30.0) -> tuple[PollResult, bytes, bytes]:
    """Poll like the heartbeat does (offsets advanced by what was read) until the job exits."""
    progress = log = b""
    with trio.fail_after(limit_s):
        while True:
            res = await ws.poll(work, 0, len(progress), len(log))
            progress += res.progress
            log += res.log
            if res.state == "exited":
                return res, progress, log
            await trio.sleep(0.05)


async def offer_and_launch(cloud: ServerlessCloud, gpu: str = "A100-80G", n: int = 1) -> tuple[Offer, Machine]:
    offers = await cloud.offers(CandidateSpec(cloud="runpod-serverless", gpu=gpu), 0)
    assert len(offers) == 1
    return offers[0], await cloud.launch(offers[0], name(n), time.time() + 3600)


def test_a_job_runs_for_real_on_a_worker_and_the_endpoint_goes(fake: FakeRunPodServerless, cloud_of: Any,
                                                                 tmp_path: Path) -> None:
    cloud = cloud_of()
    handles: list[str] = []

    async def record(handle: str) -> None:
        handles.append(handle)

    async def main() -> None:
        offer, machine = await offer_and_launch(cloud)
        assert offer.hourly_usd == pytest.approx(2.72)  # the pool's serverless price, from the catalog
        ws = await cloud.connect(machine)
        work = ws.work_dir("t", 7, 0)
        cmd = ('echo "{\\"stage\\": \\"train\\", \\"seed\\": $ACTOR_RUN_SEED}" >> "$ACTOR_RUN_PROGRESS"; '
               'echo hello; echo result > "$ACTOR_RUN_OUT/r.txt"')
        assert await ws.start(launch_of(work, cmd), record) == 0
        assert fake.submitted
        assert handles == [f'{{"endpoint_id":"{machine.id}","job_id":"{fake.submitted[0]}"}}']
        res, progress, log = await run_until_end(ws, work)
        assert res.exit_code == 0
        assert b'"seed": 7' in progress
        assert b"hello" in log
        assert res.billed_s >= 0
        await ws.fetch(work, tmp_path / "got")
        assert (tmp_path / "got" / "out" / "r.txt").read_text() == "result\n"
        await ws.aclose()
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert fake.live_endpoints() == []
    assert fake.count("GET", "/v2/serverless/{id}", 404) == 1  # the delete was proven by a read


async def submitted(cloud: ServerlessCloud, command: str, gpu: str = "A100-80G") -> tuple[Machine, Any, str]:
    _, machine = await offer_and_launch(cloud, gpu)
    ws = await cloud.connect(machine)
    work = ws.work_dir("t", 7, 0)
    await ws.start(launch_of(work, command))
    return machine, ws, work


async def poll_until_raises(ws: Any, work: str, limit_s: float = 30.0) -> BaseException:
    with trio.fail_after(limit_s):
        while True:
            try:
                await ws.poll(work, 0, 0, 0)
            except (Refused, MachineGone) as exc:
                return exc
            await trio.sleep(0.05)


@pytest.mark.parametrize(("fault", "code"), [("throttled", Code.NO_CAPACITY), ("unhealthy", Code.LAUNCH_FAILED)])
def test_workers_that_never_take_the_job_end_it_past_their_grace(fake: FakeRunPodServerless, cloud_of: Any,
                                                                  fault: str, code: Code) -> None:
    getattr(fake, fault).add("AMPERE_80")
    cloud = cloud_of(throttled_grace_s=0.3, unhealthy_grace_s=0.3, queue_grace_s=60)

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "true")
        first = await ws.poll(work, 0, 0, 0)
        assert first.state == "running"  # within the grace, a queued job is waited for
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == code
        assert fault in str(exc)
        await ws.aclose()  # the queued job is cancelled before the endpoint goes
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert fake.queue_calls.count(("POST", "/v2/{endpoint}/cancel/{job}", 200)) == 1
    assert fake.live_endpoints() == []


def test_a_job_queued_with_no_worker_past_the_queue_grace_is_no_capacity(fake: FakeRunPodServerless,
                                                                          cloud_of: Any) -> None:
    fake.held = True
    cloud = cloud_of(queue_grace_s=0.3)

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "true")
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == Code.NO_CAPACITY
        assert "in the queue" in str(exc)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)


def test_429_waits_its_retry_after_and_repeats_the_call(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "true")
        fake.queue_rate_limit(2, retry_after=0.2)
        fake.rate_limit(1, retry_after=0)
        t0 = trio.current_time()
        res, _, _ = await run_until_end(ws, work)
        assert res.exit_code == 0
        assert trio.current_time() - t0 >= 0.4  # both Retry-Afters were waited out
        await cloud.delete(machine.name, machine.id)  # the REST 429 is repeated too
        assert cloud.api.statistics().rate_limited == 3
        await cloud.aclose()

    trio.run(main)
    assert fake.live_endpoints() == []


def test_a_job_whose_status_expired_is_unreachable(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "sleep 30")
        fake.wait_for(lambda: fake.jobs[fake.submitted[0]].status == "IN_PROGRESS")
        fake.expire(fake.submitted[0])
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == Code.UNREACHABLE
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)


def test_a_platform_cancel_is_a_preemption(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "sleep 30")
        fake.wait_for(lambda: fake.jobs[fake.submitted[0]].status == "IN_PROGRESS")
        fake.platform_cancel(fake.submitted[0])
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, MachineGone)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)


def test_a_non_zero_exit_comes_back_with_its_output_and_code(fake: FakeRunPodServerless, cloud_of: Any,
                                                              tmp_path: Path) -> None:
    cloud = cloud_of()

    async def main() -> None:
        machine, ws, work = await submitted(cloud, 'echo partial > "$ACTOR_RUN_OUT/p.txt"; echo oops >&2; exit 3')
        res, _, log = await run_until_end(ws, work)
        assert (res.exit_code, log) == (3, b"oops\n")
        await ws.fetch(work, tmp_path / "got")
        assert (tmp_path / "got" / "out" / "p.txt").read_text() == "partial\n"
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    job = fake.jobs[fake.submitted[0]]
    assert (job.status, job.error) == ("FAILED", "the job exited 3")  # the platform calls it failed


def test_a_handler_error_is_job_failed_and_not_retried(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        _, machine = await offer_and_launch(cloud)
        ws = await cloud.connect(machine)
        work = ws.work_dir("t", 7, 0)
        # an archive the handler cannot open: it raises (FAILED, no exit code)
        ws._pack = lambda launch: b"not a tar"  # type: ignore[method-assign]
        await ws.start(launch_of(work, "true"))
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == Code.JOB_FAILED
        assert "not a tar.gz" in str(exc)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert len(fake.submitted) == 1


def test_a_workers_quota_refusal_reclaims_our_idle_endpoints_then_succeeds(fake: FakeRunPodServerless,
                                                                           cloud_of: Any) -> None:
    fake.quota_workers = 2
    cloud = cloud_of()
    asked: list[list[str]] = []

    async def reclaim(machines: list[Machine]) -> list[Machine]:
        asked.append(sorted(m.name for m in machines))
        return [m for m in machines if m.name == name(1)]  # a dead run's; name(2) is a live one's

    cloud.reclaim = reclaim

    async def main() -> None:
        _, dead = await offer_and_launch(cloud, n=1)
        _, live = await offer_and_launch(cloud, n=2)
        _, third = await offer_and_launch(cloud, n=3)  # over the quota: the dead run's endpoint goes first
        assert asked == [sorted([name(1), name(2)])]
        assert {m.id for m in await cloud.list_ours("ar-")} == {live.id, third.id}
        with pytest.raises(LaunchRefused) as refused:  # nothing idle left to reclaim: the next account
            await offer_and_launch(cloud, n=4)
        assert refused.value.code == Code.QUOTA
        for m in (live, third):
            await cloud.delete(m.name, m.id)
        await cloud.aclose()
        del dead

    trio.run(main)
    assert fake.live_endpoints() == []


def test_a_delete_answered_500_that_worked_is_proven_by_a_read(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()
    fake.delete_500_done = 1

    async def main() -> None:
        _, machine = await offer_and_launch(cloud)
        await cloud.delete(machine.name, machine.id)
        await cloud.delete(machine.name, machine.id)  # idempotent: gone is gone
        await cloud.aclose()

    trio.run(main)
    assert fake.count("DELETE", "/v2/serverless/{id}", 500) == 1
    assert fake.live_endpoints() == []


def test_bad_settings_name_their_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RP_TEST_KEY", "k")
    with pytest.raises(SpecError, match=r"clouds\.runpod-serverless\.image"):
        make_cloud("runpod-serverless", {"api_key_env": "RP_TEST_KEY"}, tmp_path)
    with pytest.raises(SpecError, match="idle_timeout_s"):
        make_cloud("runpod-serverless", {"image": "i", "api_key_env": "RP_TEST_KEY", "idle_timeout_s": 0}, tmp_path)
    monkeypatch.delenv("RP_TEST_KEY")
    with pytest.raises(SpecError, match="RP_TEST_KEY"):
        make_cloud("runpod-serverless", {"image": "i", "api_key_env": "RP_TEST_KEY"}, tmp_path)


def test_an_offer_without_its_pool_asks_the_catalog(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        machine = await cloud.launch(Offer(cloud="runpod-serverless", gpu="H100", hourly_usd=4.18), name(), DEADLINE)
        assert fake.endpoints[machine.id]["gpu"]["pools"] == ["HOPPER_141"]
        with pytest.raises(LaunchRefused) as refused:  # a class with no serverless pool: walk on
            await cloud.launch(Offer(cloud="runpod-serverless", gpu="B200"), name(2), DEADLINE)
        assert refused.value.code == Code.NO_CAPACITY
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert fake.live_endpoints() == []


def test_a_shape_asks_workers_of_that_many_gpus_at_their_price_on_hosts_with_the_classs_cuda(
        fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        (one,) = await cloud.offers(CandidateSpec(cloud="runpod-serverless", gpu="H100"), 0)
        (two,) = await cloud.offers(CandidateSpec(cloud="runpod-serverless", gpu="H100:2"), 0)
        assert (two.gpu, two.hourly_usd) == ("H100:2", pytest.approx(2 * one.hourly_usd))  # the worker's price
        machine = await cloud.launch(two, name(), DEADLINE)
        gpu = fake.endpoints[machine.id]["gpu"]
        assert (gpu["count"], gpu["minCudaVersion"]) == (2, "11.8")  # Hopper's floor (clouds/gpus.py CUDA_FLOOR)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert fake.live_endpoints() == []


# --- under RunPod's SDK worker loop: failures classified, a cancel that stops the command, bounded chunks

def pids_of(path: Path) -> list[psutil.Process] | None:
    return [psutil.Process(int(p)) for p in path.read_text().split()] if path.exists() else None


def still_running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def gone_by(procs: list[psutil.Process], end: float) -> list[psutil.Process]:
    """Those of `procs` still running at `end` (time.monotonic()), waiting on them, no sleep."""
    while (alive := still_running(procs)) and time.monotonic() < end:
        psutil.wait_procs(alive, timeout=min(0.2, max(0.0, end - time.monotonic())))
    return still_running(procs)


def with_pids(pids: Path, body: str) -> str:
    return f'sleep 600 & echo $$ $! > "{pids}.tmp"; mv "{pids}.tmp" "{pids}"; {body}'


async def wait_for_pids(pids: Path, limit_s: float = 60.0) -> list[psutil.Process]:
    with trio.fail_after(limit_s):
        while (procs := pids_of(pids)) is None:  # noqa: ASYNC110 - a file has no event to wait on
            await trio.sleep(0.05)
    return procs


@pytest.mark.parametrize("body", ["while :; do echo tick; sleep 0.05; done", "sleep 600"], ids=["printing", "silent"])
def test_a_cancel_stops_the_command_within_5_s_of_reaching_the_worker(fake: FakeRunPodServerless, cloud_of: Any,
                                                                       tmp_path: Path, body: str) -> None:
    cloud, pids = cloud_of(), tmp_path / "pids"

    async def main() -> list[psutil.Process]:
        machine, ws, work = await submitted(cloud, with_pids(pids, body))
        procs = await wait_for_pids(pids)
        assert len(still_running(procs)) == 2
        await ws.stop(work)  # the queue's /cancel, as the lease sends it
        job = fake.submitted[0]
        await trio.to_thread.run_sync(fake.wait_for, lambda: job in fake.stop_delivered)
        left = await trio.to_thread.run_sync(gone_by, procs, fake.stop_delivered[job] + 5.0)
        assert left == [], f"still running 5 s after the stop reached the worker: {left}"
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()
        return procs

    trio.run(main)
    assert fake.jobs[fake.submitted[0]].status == "CANCELLED"


def test_a_worker_stopped_by_sigterm_kills_the_command_and_the_job_is_preempted(fake: FakeRunPodServerless,
                                                                                 cloud_of: Any, tmp_path: Path) -> None:
    cloud, pids = cloud_of(), tmp_path / "pids"

    async def main() -> None:
        machine, ws, work = await submitted(cloud, with_pids(pids, "sleep 600"))
        procs = await wait_for_pids(pids)
        t0 = time.monotonic()
        await trio.to_thread.run_sync(lambda: fake.terminate_workers(grace_s=60))  # SIGTERM, as a stopped container
        assert time.monotonic() - t0 < 30  # the worker ended on its own, long before its SIGKILL
        assert await trio.to_thread.run_sync(gone_by, procs, t0 + 5.0) == []
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, MachineGone)
        assert "SIGTERM" in str(exc)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)


RAISING = """
import sys
import runpod
from actor_run.protocols.serverless import InputError
form = sys.argv[1]

def generator(job):
    raise InputError("could not download the archive from http://store.invalid/a.tar.gz: 404")
    yield {}

def plain(job):
    raise InputError("could not download the archive from http://store.invalid/a.tar.gz: 404")

async def yielded(job):  # what actor-run's handler does
    yield {"error": str(InputError("could not download the archive from http://store.invalid/a.tar.gz: 404"))}

handler = {"generator": generator, "plain": plain, "yielded": yielded}[form]
runpod.serverless.start({"handler": handler, "return_aggregate_stream": True})
"""


@pytest.mark.parametrize("form", ["yielded", "generator", "plain"])
def test_an_input_failure_is_input_wherever_the_sdk_puts_it(fake: FakeRunPodServerless, cloud_of: Any,
                                                             form: str) -> None:
    """A terminal `{"error": ...}` yielded (actor-run's handler: the SDK passes it through as it is),
    or a handler that raises (an older image's: the SDK wraps the message, `handler: ... traceback`
    for a generator, a JSON object for a plain function); the marker is read in each."""
    fake.worker_argv = [sys.executable, "-c", RAISING, form]
    cloud = cloud_of()

    async def main() -> None:
        machine, ws, work = await submitted(cloud, "true")
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == Code.INPUT, str(exc)
        assert "could not download the archive from http://store.invalid/a.tar.gz: 404" in str(exc)
        assert "traceback" not in str(exc)
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    error = fake.jobs[fake.submitted[0]].error or ""
    assert error.startswith({"yielded": "actor-run input: ", "generator": "handler: actor-run input: ",
                             "plain": '{"error_type"'}[form])


def test_a_big_log_streams_in_chunks_under_the_1_mb_limit(fake: FakeRunPodServerless, cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        _, ws, work = await submitted(cloud, "head -c 1000000 /dev/zero; head -c 2000000 /dev/zero | tr '\\0' x")
        res, _, log = await run_until_end(ws, work, limit_s=120)
        assert res.exit_code == 0
        assert log == b"\0" * 1_000_000 + b"x" * 2_000_000
        await cloud.aclose()

    trio.run(main)
    assert len(fake.chunk_sizes) >= 3
    assert max(fake.chunk_sizes) <= 1_000_000  # `serving` also fails the test on any chunk over it


def test_an_out_folder_over_a_chunk_without_a_store_is_transfer_failed(fake: FakeRunPodServerless,
                                                                         cloud_of: Any) -> None:
    cloud = cloud_of()

    async def main() -> None:
        _, ws, work = await submitted(cloud, 'head -c 2000000 /dev/urandom > "$ACTOR_RUN_OUT/big.bin"')
        exc = await poll_until_raises(ws, work, limit_s=120)
        assert isinstance(exc, Refused)
        assert exc.code == Code.TRANSFER_FAILED
        assert "pack to 2" in str(exc)
        assert f"over the {OUT_INLINE_LIMIT}" in str(exc)
        await cloud.aclose()

    trio.run(main)
