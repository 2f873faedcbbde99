"""runpod-serverless archives above the inline limit go through an S3-compatible store (moto's S3
server on loopback): put once under their sha256, the worker (the real handler, in the fake's
subprocess) downloads them by a presigned URL and checks the hash; no key of the store reaches
the payload."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.moto_s3 import ACCESS, SECRET, MotoS3
from fakes.moto_server import MotoServer
from fakes.runpod_serverless import FakeRunPodServerless, serving, settings
from test_runpod_serverless import offer_and_launch, poll_until_raises, run_until_end

from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.clouds.runpod_serverless import ServerlessCloud
from actor_run.protocols.failures import Code, Refused, SpecError
from actor_run.protocols.hosts.workspace import Launch
from actor_run.protocols.serverless import INLINE_LIMIT

LIMIT = 2048  # the test's inline limit: the code below packs to about 8 KB


@pytest.fixture
def fake(tmp_path: Path, runpod_zygote: Any) -> Iterator[FakeRunPodServerless]:
    with serving(tmp_path / "fake") as server:
        yield server


@pytest.fixture
def s3(moto: MotoServer) -> Iterator[MotoS3]:
    with MotoS3(moto, "jobs") as store:
        yield store


def cloud(fake: FakeRunPodServerless, s3: MotoS3 | None, tmp_path: Path, **extra: Any) -> ServerlessCloud:
    if s3 is not None:
        extra["object_store"] = {"url": s3.endpoint, "bucket": s3.bucket, "access_key_env": "T_S3_ACCESS",
                                 "secret_key_env": "T_S3_SECRET", "prefix": "ar/"}
    c = make_cloud("runpod-serverless", settings(fake, inline_limit=LIMIT, **extra), tmp_path / "state")
    assert isinstance(c, ServerlessCloud)
    return c


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RP_TEST_KEY", "test-key")
    monkeypatch.setenv("T_S3_ACCESS", ACCESS)
    monkeypatch.setenv("T_S3_SECRET", SECRET)


def snapshot(tmp_path: Path) -> Path:
    code = tmp_path / "snap"
    code.mkdir()
    (code / "weights.bin").write_bytes(os.urandom(8192))  # incompressible: over the limit
    return code


async def start(c: ServerlessCloud, code: Path, seed: int, n: int) -> tuple[Any, Any, str]:
    _, machine = await offer_and_launch(c, n=n)
    ws = await c.connect(machine)
    await ws.publish_code(code, "c0de", "t")
    work = ws.work_dir("t", seed, 0)
    await ws.start(Launch(work=work, command='cp weights.bin "$ACTOR_RUN_OUT/w.bin"; echo "seed $ACTOR_RUN_SEED"',
                          code="c0de", inputs=[], env={"ACTOR_RUN_SEED": str(seed)}, lost_after_s=30))
    return machine, ws, work


def test_an_archive_over_the_limit_runs_through_the_store_put_once(fake: FakeRunPodServerless, s3: MotoS3,
                                                                     tmp_path: Path) -> None:
    c = cloud(fake, s3, tmp_path)
    code = snapshot(tmp_path)

    async def main() -> None:
        for seed in (1, 2):  # two seeds, one archive
            machine, ws, work = await start(c, code, seed, seed)
            res, _, log = await run_until_end(ws, work)
            assert (res.exit_code, log) == (0, f"seed {seed}\n".encode())
            await ws.fetch(work, tmp_path / f"got{seed}")
            assert (tmp_path / f"got{seed}" / "out" / "w.bin").read_bytes() == (code / "weights.bin").read_bytes()
            await ws.aclose()
            await c.delete(machine.name, machine.id)
        await c.aclose()

    trio.run(main)
    archives = [j.body["input"]["archive"] for j in (fake.jobs[i] for i in fake.submitted)]
    assert len(archives) == 2
    assert all("inline" not in a and a["size"] > LIMIT for a in archives)
    assert archives[0]["sha256"] == archives[1]["sha256"]
    assert len(s3.versions(f"ar/{archives[0]['sha256']}.tar.gz")) == 1  # put once for both
    sent = json.dumps([fake.jobs[i].body for i in fake.submitted])
    # only a presigned URL: the secret key never (the access key's id is in the URL's credential scope, as
    # SigV4 presigning has it: an id, not a secret)
    assert SECRET not in sent
    assert "T_S3_SECRET" not in sent
    assert "aws_secret" not in sent.lower()


def test_a_corrupted_object_is_an_input_failure(fake: FakeRunPodServerless, s3: MotoS3, tmp_path: Path) -> None:
    c = cloud(fake, s3, tmp_path)
    code = snapshot(tmp_path)

    async def main() -> None:
        machine, ws, work = await start(c, code, 1, 1)
        res, _, _ = await run_until_end(ws, work)
        assert res.exit_code == 0
        await c.delete(machine.name, machine.id)
        key = f"ar/{fake.jobs[fake.submitted[0]].body['input']['archive']['sha256']}.tar.gz"
        good = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bytes(b ^ 0xFF for b in good))  # same size
        machine, ws, work = await start(c, code, 2, 2)
        exc = await poll_until_raises(ws, work)
        assert isinstance(exc, Refused)
        assert exc.code == Code.INPUT
        assert "sha256" in str(exc)
        assert "Signature" not in str(exc)
        await c.delete(machine.name, machine.id)
        await c.aclose()

    trio.run(main)


def test_without_a_store_the_input_error_names_the_limit_and_the_setting(fake: FakeRunPodServerless,
                                                                          tmp_path: Path) -> None:
    c = cloud(fake, None, tmp_path)
    code = snapshot(tmp_path)

    async def main() -> None:
        with pytest.raises(Refused) as err:
            await start(c, code, 1, 1)
        assert err.value.code == Code.INPUT
        assert f"over the {LIMIT}" in str(err.value)
        assert "object_store" in str(err.value)
        await c.aclose()

    trio.run(main)
    assert fake.submitted == []


def test_store_settings_name_their_field(fake: FakeRunPodServerless, s3: MotoS3, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("T_S3_SECRET")
    with pytest.raises(SpecError, match=r"object_store: the environment variable T_S3_SECRET .* not set"):
        cloud(fake, s3, tmp_path)
    monkeypatch.setenv("T_S3_SECRET", SECRET)
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if boto3 were not installed
    with pytest.raises(SpecError, match=r"object_store: an object store needs boto3: pip install 'actor-run\[s3\]'"):
        cloud(fake, s3, tmp_path)
    c = make_cloud("runpod-serverless", settings(fake), tmp_path / "state")
    assert isinstance(c, ServerlessCloud)
    assert c.store is None
    assert c.settings.inline_limit == INLINE_LIMIT > 7_000_000  # the real default: RunPod's 10 MB body


def test_an_out_folder_over_a_stream_chunk_comes_back_through_the_store(fake: FakeRunPodServerless, s3: MotoS3,
                                                                         tmp_path: Path) -> None:
    """The worker (the real handler under RunPod's SDK) puts an out/ too large for a 1 MB chunk to
    the presigned PUT URL its payload carries; the controller gets it from the store by the key in
    the job's handle and checks size and hash."""
    c = cloud(fake, s3, tmp_path)
    handles: list[str] = []

    async def record(handle: str) -> None:
        handles.append(handle)

    async def main() -> None:
        _, machine = await offer_and_launch(c)
        ws = await c.connect(machine)
        work = ws.work_dir("t", 1, 0)
        await ws.start(Launch(work=work, command='head -c 2000000 /dev/urandom > "$ACTOR_RUN_OUT/big.bin"',
                              code=None, inputs=[], env={"ACTOR_RUN_SEED": "1"}, lost_after_s=30), record)
        res, _, _ = await run_until_end(ws, work, limit_s=120)
        assert res.exit_code == 0
        assert await ws.fetch(work, tmp_path / "got") > 2_000_000
        await ws.aclose()
        await c.delete(machine.name, machine.id)
        await c.aclose()

    trio.run(main)
    assert (tmp_path / "got" / "out" / "big.bin").stat().st_size == 2_000_000
    key = json.loads(handles[0])["out_key"]
    assert key.startswith("ar/out/")
    assert len(s3.versions(key)) == 1
    assert max(fake.chunk_sizes) <= 1_000_000
    sent = json.dumps(fake.jobs[fake.submitted[0]].body)
    assert "out_put" in sent
    assert SECRET not in sent
