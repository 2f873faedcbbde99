"""The fake RunPod serverless's workers, forked from a warm process (tests/fakes/zygote.py) instead of
started as fresh interpreters: each reads its own environment (the SDK's module-level reads
included) and nothing only the zygote had; a kill -9 is seen as that worker's death, with its status;
a dead zygote is started again; an environment the zygote's imports would not match is started
fresh; closing the zygote leaves no worker running. (A fake told `warm = False`, or given another
command than `python -m` or `-c`, starts fresh interpreters.)"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio
from fakes.runpod_serverless import FakeRunPodServerless, serving, settings
from fakes.zygote import KEPT, MODULE, PURGED, ForkedProcess, Zygote
from support.waits import poll
from test_runpod_serverless import gone_by, run_until_end, submitted, wait_for_pids, with_pids

from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.clouds.runpod_serverless import ServerlessCloud

PING = "/v2/{endpoint}/ping/{id}"


@pytest.fixture
def own_zygote() -> Iterator[Zygote]:
    """A zygote of this test's own, with ZYGOTE_ONLY in its environment (and in no worker's)."""
    z = Zygote(extra_env={"ZYGOTE_ONLY": "from-the-zygote"})
    try:
        yield z
    finally:
        z.close()


def cloud_for(fake: FakeRunPodServerless, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ServerlessCloud:
    monkeypatch.setenv("RP_TEST_KEY", "test-key")
    cloud = make_cloud("runpod-serverless", settings(fake), tmp_path / "state")
    assert isinstance(cloud, ServerlessCloud)
    return cloud


def worker_env(port: int) -> dict[str, str]:
    """A worker's environment whose job-take URL answers nothing (the SDK's loop retries it for ever)."""
    base = f"http://127.0.0.1:{port}/v2/ep"
    return {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD")} | {
        "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID", "RUNPOD_WEBHOOK_PING": f"{base}/ping/$RUNPOD_POD_ID",
        "RUNPOD_POD_ID": "w1", "RUNPOD_AI_API_KEY": "k", "RUNPOD_SKIP_GPU_CHECK": "true",
        "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ARGV = [sys.executable, "-m", MODULE]


def gone(pid: int) -> bool:
    """No such process, or one that has ended and waits only for its parent (init) to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_forked_worker_reads_its_own_environment_and_nothing_only_the_zygote_had(
        own_zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runpod_zygote: Zygote) -> None:
    monkeypatch.setenv("WORKER_OWN", "from-the-fake")  # in what the fake gives its workers, not in the zygote's
    with serving(tmp_path / "fake") as fake:
        fake.zygote = own_zygote
        cloud = cloud_for(fake, tmp_path, monkeypatch)

        async def main() -> bytes:
            machine, ws, work = await submitted(
                cloud, 'echo "own=${WORKER_OWN-unset} zygote=${ZYGOTE_ONLY-unset} account=${RP_TEST_KEY-unset}"')
            res, _, log = await run_until_end(ws, work)
            assert res.exit_code == 0
            await ws.aclose()
            await cloud.delete(machine.name, machine.id)
            await cloud.aclose()
            return log

        log = trio.run(main)
        assert own_zygote.pid is not None  # the zygote that forked the worker had ZYGOTE_ONLY
        assert b"ZYGOTE_ONLY=from-the-zygote" in Path(f"/proc/{own_zygote.pid}/environ").read_bytes().split(b"\0")
        # the command's environment is the worker's own (the handler passes it on)
        assert log == b"own=from-the-fake zygote=unset account=unset\n"  # nor the account's key
        # the SDK's module-level reads were the worker's: the zygote had no RUNPOD_* at all, yet the
        # job was taken and done under this worker's id (rp_job's JOB_GET_URL, worker_state's
        # WORKER_ID) and its pings came (rp_ping's Heartbeat, built when worker.py is imported)
        fake.wait_for(lambda: any(t == PING and s == 200 for _, t, s in fake.worker_calls))
        workers = list(fake.workers.values())
        assert [type(w.proc) for w in workers] == [ForkedProcess]
        assert fake.jobs[fake.submitted[0]].worker == workers[0].id
    assert own_zygote.refused == []
    assert own_zygote.starts == 1


def test_a_worker_killed_with_sigkill_is_seen_dead_with_its_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runpod_zygote: Zygote) -> None:
    pids = tmp_path / "pids"
    with serving(tmp_path / "fake") as fake:
        cloud = cloud_for(fake, tmp_path, monkeypatch)

        async def main() -> None:
            machine, ws, _ = await submitted(cloud, with_pids(pids, "sleep 600"))
            procs = await wait_for_pids(pids)
            worker = fake.workers[fake.jobs[fake.submitted[0]].worker]
            assert isinstance(worker.proc, ForkedProcess)
            assert worker.proc.poll() is None
            os.kill(worker.proc.pid, signal.SIGKILL)  # from outside, by its pid, as `kill -9` would
            assert await trio.to_thread.run_sync(worker.proc.wait, 30) == -signal.SIGKILL
            assert worker.proc.poll() == -signal.SIGKILL
            assert not psutil.pid_exists(worker.proc.pid)  # reaped: not even a zombie is left
            for p in procs:  # the command outlives a worker killed so (its own session)
                p.kill()
            assert await trio.to_thread.run_sync(gone_by, procs, time.monotonic() + 10) == []
            await ws.aclose()
            await cloud.delete(machine.name, machine.id)
            await cloud.aclose()

        trio.run(main)


def working_in(folder: Path) -> list[psutil.Process]:
    """The live processes whose working folder is `folder` (a worker and what it started)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.cwd() == str(folder) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def in_group(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


GROUP = """
import os, sys, time
if os.fork() == 0:  # another process of its group, as the SDK's ping process is
    time.sleep(600)  # the worker's own life: it lives until it is killed
    os._exit(0)
print("up", flush=True)
time.sleep(600)  # the worker's own life: it lives until it is killed
"""


def test_a_dead_zygote_is_started_again_and_closing_it_leaves_no_worker(tmp_path: Path) -> None:
    z = Zygote(warm=())  # its mechanics alone: no import to wait for
    argv = [sys.executable, "-c", GROUP]
    first = second = None
    try:
        with (tmp_path / "w.log").open("ab") as out:
            first = z.spawn(argv, dict(os.environ), str(tmp_path), out.fileno())
            assert first is not None
            zygote_pid = z.pid
            assert zygote_pid is not None
            os.kill(zygote_pid, signal.SIGKILL)
            assert psutil.wait_procs([psutil.Process(zygote_pid)], timeout=30)[1] == []
            second = z.spawn(argv, dict(os.environ), str(tmp_path), out.fileno())  # finds it dead, starts another
        assert second is not None
        assert z.starts == 2
        assert z.pid != zygote_pid
        assert first.poll() is None  # an orphan now, still running
        poll(lambda: (tmp_path / "w.log").read_text().count("up") == 2, 30, "both workers and their group")
        assert len(in_group(second.pid)) == 2
        z.close()
        assert second.wait(30) == -signal.SIGKILL  # the zygote killed its worker before it ended
        assert not psutil.pid_exists(second.pid)  # ... and reaped it
        assert psutil.wait_procs(in_group(second.pid), timeout=30)[1] == []  # and the rest of its group
        first.kill()  # through its pidfd, though its zygote is gone
        assert first.wait(30) is None  # dead, its parent gone: how it ended is nobody's to tell us
        assert gone(first.pid)
        assert gone(zygote_pid)
    finally:
        z.close()
        for proc in (first, second):  # what is left of their groups
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    assert psutil.wait_procs(working_in(tmp_path), timeout=30)[1] == []


def test_an_environment_the_zygotes_imports_read_otherwise_is_not_forked(tmp_path: Path, runpod_zygote: Zygote) -> None:
    z = runpod_zygote  # this test process's, as the fake uses it
    env = worker_env(closed_port()) | {"AIOHTTP_NO_EXTENSIONS": "1"}  # aiohttp reads it at import
    assert z.spawn(ARGV, env, str(tmp_path), 2) is None
    assert z.refused[-1] == "the zygote's imports read ['AIOHTTP_NO_EXTENSIONS'] from an environment that differs"
    env = worker_env(closed_port()) | {"PYTHONHASHSEED": "1"}  # read as the interpreter starts
    assert z.spawn(ARGV, env, str(tmp_path), 2) is None
    assert "start-up" in z.refused[-1]
    assert z.spawn(["/bin/sh", "-c", "true"], env, str(tmp_path), 2) is None  # not Python's
    with pytest.raises(OSError, match="FileNotFoundError"):  # as Popen raises for a cwd that is not there
        z.spawn(ARGV, worker_env(closed_port()), str(tmp_path / "nowhere"), 2)


SHOW = """
import os, sys
print(__name__, sys.argv, repr(sys.path[0]), os.getcwd(), os.environ.get("OWN"))
print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")), os.getsid(0) == os.getpid(), flush=True)
sys.exit(3)
"""


def test_python_c_runs_forked_as_python_c_would_run_it(tmp_path: Path, runpod_zygote: Zygote) -> None:
    env = worker_env(closed_port()) | {"OWN": "mine"}
    with (tmp_path / "c.log").open("ab") as out:
        proc = runpod_zygote.spawn([sys.executable, "-c", SHOW, "a", "b"], env, str(tmp_path), out.fileno())
    assert isinstance(proc, ForkedProcess)
    assert proc.wait(30) == 3
    shown, fds = (tmp_path / "c.log").read_text().splitlines()
    assert shown == f"__main__ ['-c', 'a', 'b'] '' {tmp_path} mine"
    assert fds == "[0, 1, 2, 3] True"  # 3: listdir's own; a session of its own


def imports_run_at_import(tree: ast.Module) -> list[str]:
    """The modules a module's import imports (its functions' imports run when they are called: an
    `import runpod` there finds the worker's own)."""
    found: list[str] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.append("." * child.level + (child.module or ""))
            walk(child)

    walk(tree)
    return found


def test_what_the_zygote_keeps_of_the_sdk_imports_nothing_it_imports_again() -> None:
    import runpod

    root = Path(runpod.__file__).parent.parent
    for name in KEPT:
        imported = imports_run_at_import(ast.parse((root / (name.replace(".", "/") + ".py")).read_text()))
        assert "cpuinfo" in imported  # why it is kept: its import asks py-cpuinfo, which runs a subprocess
        assert [m for m in imported if m.startswith(".") or any(m == p or m.startswith(p + ".") for p in PURGED)] \
            == [], name
