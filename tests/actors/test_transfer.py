"""The transfer actor (actors/transfer.py): code and inputs up by content hash, outputs down, never
through a link the job made. Against a real `local` machine (a sandbox folder and a real `sh`)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from actor_kit import Machines, ProbeHandle

from actor_run.actors import Context, TransferActor
from actor_run.protocols.failures import Code
from actor_run.protocols.hosts.content import file_sha256, tree_sha256
from actor_run.protocols.messages import ChildFailed, Fetch, Fetched, InputRef, TransferFailed, Upload, Uploaded
from actor_run.protocols.specs import Job, PolicySpec

POLICY = PolicySpec(poll_s=0.1, lost_after_s=5.0)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "run.sh").write_text("echo running\n")
    (code / "pkg" / "model.py").write_text("WEIGHTS = [1, 2, 3]\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"\0junk")  # never part of the snapshot
    return code


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data.csv"
    data.write_text("x,y\n1,2\n" * 100)
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.txt").write_text("image a")
    (folder / "b.txt").write_text("image b")
    return {"data": str(data), "images": str(folder)}


def start_transfer(ctx: Context, probe: ProbeHandle, job: Job) -> pykka.ActorRef[Any]:
    return TransferActor.start(ctx, probe.ref, job=job, attempt=0)


@pytest.fixture
def transfer_of(ctx: Context, probe: ProbeHandle) -> Iterator[Any]:
    started: list[pykka.ActorRef[Any]] = []

    def make(job: Job) -> pykka.ActorRef[Any]:
        ref = start_transfer(ctx, probe, job)
        started.append(ref)
        return ref

    try:
        yield make
    finally:
        for ref in started:
            ref.stop()


def test_upload_publishes_code_and_inputs_once_per_host(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, code_dir: Path, inputs: dict[str, str],
) -> None:
    job = Job(name="t", command="sh run.sh", seed=1, code=str(code_dir), inputs=inputs, policy=POLICY)
    transfer = transfer_of(job)
    with machines.open() as (machine, _ws):
        transfer.tell(Upload(machine=machine.name))
        up = probe.wait_for(Uploaded)
        assert (up.job, up.seed, up.attempt) == ("t", 1, 0)
        # the snapshot leaves __pycache__ out: the hash is that of the tree without it
        clean = code_dir.parent / "code-clean"
        shutil.copytree(code_dir, clean, ignore=shutil.ignore_patterns("__pycache__"))
        expected_code = tree_sha256(clean)
        assert up.code == expected_code
        assert up.inputs == [
            InputRef(name="data", sha256=file_sha256(Path(inputs["data"])), basename="data.csv"),
            InputRef(name="images", sha256=tree_sha256(Path(inputs["images"])), basename="images"),
        ]
        root = Path(machine.root)
        published = root / "code" / up.code
        assert (published / "run.sh").read_text() == "echo running\n"
        assert (published / "pkg" / "model.py").read_text() == "WEIGHTS = [1, 2, 3]\n"
        assert (published / ".complete").exists()
        assert not (published / "__pycache__").exists()
        data = root / "objects" / up.inputs[0].sha256 / "data"
        assert data.read_text() == Path(inputs["data"]).read_text()
        assert (root / "objects" / up.inputs[1].sha256 / "data" / "b.txt").read_text() == "image b"
        assert not [p for p in (root / "code").iterdir() if p.name.startswith(".incoming")]
        sent = sum(len(p.read_bytes()) for p in (code_dir / "run.sh", code_dir / "pkg" / "model.py"))
        sent += len(Path(inputs["data"]).read_bytes()) + len("image a") + len("image b")
        assert up.bytes_sent == sent

        transfer.tell(Upload(machine=machine.name))
        again = probe.wait_for(Uploaded)
        assert again.bytes_sent == 0
        assert (again.code, again.inputs) == (up.code, up.inputs)


def test_a_second_transfer_actor_on_the_same_machine_sends_nothing(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, code_dir: Path, inputs: dict[str, str],
) -> None:
    """Publishing is per host, not per actor: attempt 1 on the machine of attempt 0 sends 0 bytes."""
    job = Job(name="t", command="sh run.sh", seed=1, code=str(code_dir), inputs=inputs, policy=POLICY)
    with machines.open() as (machine, _ws):
        transfer_of(job).tell(Upload(machine=machine.name))
        assert probe.wait_for(Uploaded).bytes_sent > 0
        transfer_of(job).tell(Upload(machine=machine.name))
        assert probe.wait_for(Uploaded).bytes_sent == 0


def test_a_job_without_code_uploads_only_its_inputs(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, inputs: dict[str, str],
) -> None:
    job = Job(name="t", command="true", seed=1, inputs={"data": inputs["data"]}, policy=POLICY)
    with machines.open() as (machine, _ws):
        transfer_of(job).tell(Upload(machine=machine.name))
        up = probe.wait_for(Uploaded)
        assert up.code is None
        assert [i.name for i in up.inputs] == ["data"]
        assert up.bytes_sent == os.path.getsize(inputs["data"])


def test_an_input_that_does_not_exist_is_transfer_failed_input(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere.csv"
    job = Job(name="t", command="true", seed=1, inputs={"weights": str(missing)}, policy=POLICY)
    with machines.open() as (machine, _ws):
        transfer = transfer_of(job)
        transfer.tell(Upload(machine=machine.name))
        failed = probe.wait_for(TransferFailed)
        assert failed.failure == Code.INPUT
        assert "weights" in failed.detail
        assert str(missing) in failed.detail
        assert not probe.box.of(Uploaded)
        objects = Path(machine.root) / "objects"
        assert not objects.exists() or list(objects.iterdir()) == []
        assert transfer.is_alive()  # a refusal is an answer, not a crash


def test_fetch_brings_out_back_without_following_links(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, tmp_path: Path,
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-4f1c9a")
    job = Job(name="t", command="true", seed=1, policy=POLICY)
    # the job runs in its out/ (no code): it writes a result, links out to a secret file and to a folder
    command = (
        "echo ok > ok.txt && mkdir -p sub && echo deep > sub/deep.txt"
        f" && ln -s {secret} secret-link && ln -s /etc outside-dir"
        f" && ln -s {secret} sub/again"
    )
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        done = machines.wait_exited(ws, work, pid)
        assert (done.state, done.exit_code) == ("exited", 0)
        assert (Path(work) / "out" / "secret-link").is_symlink()  # the job did make its links

        into = tmp_path / "fetched"
        (into / "out" / "stale").mkdir(parents=True)  # what a previous fetch left in out/ is replaced
        (into / "log.txt").write_text("kept\n")  # the rest of the folder is not the fetch's
        transfer_of(job).tell(Fetch(machine=machine.name, work=work, into=str(into)))
        fetched = probe.wait_for(Fetched)
        assert fetched.bytes_received > 0
        assert (into / "out" / "ok.txt").read_text() == "ok\n"
        assert (into / "out" / "sub" / "deep.txt").read_text() == "deep\n"
        assert not (into / "response.json").exists()  # the exit record stays on the host
        assert not (into / "out" / "stale").exists()
        assert (into / "log.txt").read_text() == "kept\n"
        for name in ("secret-link", "outside-dir", "sub/again"):
            p = into / "out" / name
            assert not p.exists(), f"{name} came back"
            assert not p.is_symlink(), f"{name} came back as a link"
        for p in into.rglob("*"):
            assert not p.is_symlink(), p
            if p.is_file():
                assert b"TOP-SECRET" not in p.read_bytes(), p


def test_fetch_of_a_work_folder_that_is_gone_fetches_nothing(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, tmp_path: Path,
) -> None:
    job = Job(name="t", command="true", seed=1, policy=POLICY)
    with machines.open() as (machine, ws):
        into = tmp_path / "fetched"
        transfer_of(job).tell(Fetch(machine=machine.name, work=ws.work_dir("t", 1, 7), into=str(into)))
        fetched = probe.wait_for(Fetched)
        assert fetched.bytes_received == 0
        assert not into.exists() or list(into.iterdir()) == []


def test_an_unknown_message_fails_the_transfer_and_tells_the_parent(
    ctx: Context, probe: ProbeHandle, transfer_of: Any,
) -> None:
    transfer = transfer_of(Job(name="t", command="true", seed=1, policy=POLICY))
    transfer.tell(object())
    failed = probe.wait_for(ChildFailed)
    assert failed.child == "transfer:t/1/a0"
    assert "TypeError" in failed.detail
    assert transfer.actor_stopped.wait(10)


def test_an_input_changed_behind_the_hash_cache_is_refused_on_arrival(
    machines: Machines, probe: ProbeHandle, transfer_of: Any, tmp_path: Path,
) -> None:
    """The cache keys a digest by (path, size, mtime, inode): an edit that keeps all four gets the old
    digest, and the host's check of what arrived refuses it, leaving nothing published."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"A" * 4096)
    job = Job(name="t", command="true", seed=1, inputs={"data": str(data)}, policy=POLICY)
    with machines.open() as (first, _ws):
        transfer_of(job).tell(Upload(machine=first.name))
        probe.wait_for(Uploaded)
    st = data.stat()
    with open(data, "r+b") as f:  # same size, same inode
        f.write(b"B" * 4096)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    with machines.open() as (second, _ws):
        transfer_of(job).tell(Upload(machine=second.name))
        failed = probe.wait_for(TransferFailed)
        assert failed.failure == Code.INPUT
        assert "changed since it was read" in failed.detail
        objects = Path(second.root) / "objects"
        assert [p.name for p in objects.iterdir()] == []  # no object, no .incoming left


def wait_until(ready: Any, timeout: float = 10.0) -> bool:
    """Poll `ready()` every 10 ms, at most `timeout` seconds."""
    gate = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if ready():
            return True
        gate.wait(0.01)
    return bool(ready())


class CountingTransfer(TransferActor):
    """A TransferActor that notes every message it handles."""

    handled: list[str]

    def on_receive(self, message: Any) -> Any:
        self.handled.append(type(message).__name__)
        return super().on_receive(message)


def test_an_upload_and_a_fetch_answer_the_parent_without_a_turn_of_the_transfer_for_each_end(
    ctx: Context, machines: Machines, probe: ProbeHandle, inputs: dict[str, str], tmp_path: Path,
) -> None:
    """The reactor's answer to an upload or a fetch goes to the parent straight (bench/RESULTS.md,
    item 54): the transfer handles the two asks and nothing else, one turn fewer at each end of an
    attempt (main: four, a `_Done` after each)."""
    handled: list[str] = []
    CountingTransfer.handled = handled
    job = Job(name="t", command="echo ok > ok.txt", seed=1, inputs={"data": inputs["data"]}, policy=POLICY)
    transfer = CountingTransfer.start(ctx, probe.ref, job=job, attempt=0)
    try:
        with machines.open() as (machine, ws):
            transfer.tell(Upload(machine=machine.name))
            up = probe.wait_for(Uploaded)
            assert [i.name for i in up.inputs] == ["data"]
            work, pid = machines.start_job(ws, "echo ok > ok.txt")
            assert machines.wait_exited(ws, work, pid).state == "exited"
            into = tmp_path / "fetched"
            transfer.tell(Fetch(machine=machine.name, work=work, into=str(into)))
            assert probe.wait_for(Fetched).bytes_received > 0
            assert (into / "out" / "ok.txt").read_text() == "ok\n"
            assert transfer.is_alive()
    finally:
        transfer.stop()
    assert handled == ["Upload", "Fetch"]


def test_a_transfer_stopped_while_its_upload_is_out_tells_the_parent_nothing(
    ctx: Context, machines: Machines, probe: ProbeHandle, tmp_path: Path,
) -> None:
    """Stopped mid-upload (the attempt's release): the cancelled upload's end reaches nobody, as when
    it was the transfer's own message to a stopped actor."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 64)  # hashed in a thread for long enough to stop meanwhile
    job = Job(name="t", command="true", seed=1, inputs={"big": str(big)}, policy=POLICY)
    transfer = TransferActor.start(ctx, probe.ref, job=job, attempt=0)
    with machines.open() as (machine, _ws):
        transfer.tell(Upload(machine=machine.name))
        assert wait_until(lambda: ctx.reactor.statistics().tasks_running > 0)  # the upload is out
        transfer.stop()
        # the cancelled upload ends once its hashing thread returns; its end is what would be told
        assert wait_until(lambda: ctx.reactor.statistics().tasks_running == 0, timeout=60)
    assert not probe.box.of(Uploaded)
    assert not probe.box.of(TransferFailed)


def test_an_upload_with_nothing_to_send_answers_without_a_reactor_task(
    ctx: Context, machines: Machines, probe: ProbeHandle, transfer_of: Any,
) -> None:
    """A job with no code, no inputs and nothing to resume from sends nothing: `Uploaded` (0 bytes)
    comes from the transfer's turn, with no task on the reactor (item 58: one per attempt of a start
    burst; main spawned one that returned at once)."""
    job = Job(name="t", command="true", seed=1, policy=POLICY)
    with machines.open() as (machine, _ws):
        before = ctx.reactor.statistics().tasks_started
        transfer_of(job).tell(Upload(machine=machine.name))
        up = probe.wait_for(Uploaded)
        assert (up.bytes_sent, up.code, up.inputs, up.resume) == (0, None, [], None)
        assert ctx.reactor.statistics().tasks_started == before
