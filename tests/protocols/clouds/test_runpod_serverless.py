"""The runpod-serverless cloud against a fake RunPod on loopback (REST v2 held to RunPod's OpenAPI
document, the queue API to the contract), whose workers run actor-run's own handler in a
subprocess: offers, launch, a queue job run for real, fetch, delete, and each fault the contract
names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.runpod_serverless import FakeRunPodServerless

from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.clouds.runpod_serverless import ServerlessCloud
from actor_run.protocols.failures import Code, LaunchRefused, MachineGone, Refused
from actor_run.protocols.hosts.workspace import Launch, PollResult
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import CandidateSpec


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPodServerless]:
    server = FakeRunPodServerless(tmp_path / "fake").start()
    try:
        yield server
    finally:
        server.stop()
    assert server.violations == []
    assert server.queue_violations == []


def settings(fake: FakeRunPodServerless, **extra: Any) -> dict[str, Any]:
    return {"image": "me/actor-run-worker:1", "rest_url": fake.url, "queue_url": fake.queue_url,
            "api_key_env": "RP_TEST_KEY", "stream_s": 0.05, **extra}


@pytest.fixture
def cloud_of(fake: FakeRunPodServerless, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RP_TEST_KEY", "test-key")

    def make(**extra: Any) -> ServerlessCloud:
        c = make_cloud("runpod-serverless", settings(fake, **extra), tmp_path / "state")
        assert isinstance(c, ServerlessCloud)
        return c

    return make


def name(n: int = 1) -> str:
    return f"ar-t-{n}-a0-0123abcd-d{int(time.time() + 3600)}"


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
        assert fake.submitted and handles == [f'{{"endpoint_id":"{machine.id}","job_id":"{fake.submitted[0]}"}}']
        res, progress, log = await run_until_end(ws, work)
        assert res.exit_code == 0
        assert b'"seed": 7' in progress and b"hello" in log
        assert res.billed_s >= 0
        await ws.fetch(work, tmp_path / "got")
        assert (tmp_path / "got" / "out" / "r.txt").read_text() == "result\n"
        await ws.aclose()
        await cloud.delete(machine.name, machine.id)
        await cloud.aclose()

    trio.run(main)
    assert fake.live_endpoints() == []
    assert fake.count("GET", "/v2/serverless/{id}", 404) == 1  # the delete was proven by a read
