"""The machines of the `sim` cloud: what a caller talks to once a sim machine is launched.

Every call to a sim machine first awaits its `MachineGuard`, which raises `MachineGone` once the
provider deleted or preempted the machine (a small read when the record changed; a preemption
also stops the machine's processes). While the provider's count of changes to existing records
has not moved (one read of it shared by every guard, at most every `FOLDER_LOOK_S`; creates do not
move it), a guard takes its record as it was; otherwise it `stat`s its own record. A real sim machine is a sandbox whose
host is a `SimHost`: `LocalHost` behind the guard, under a `ShellWorkspace`.

A virtual machine (`virtual = true`) only pretends to run, in memory: `VirtualWorkspace`. No
folder, no process: `start` records a start time and hands back a fake pid; each `poll` says
`running` and appends one progress line (`{"stage": "train", "step": k}`) and one log line until
`virtual_job_s` has passed since the start (on trio's clock), then says `exited` with
`virtual_exit_code` (`wait_exit` returns at that moment). `stop` makes a running job exit 143; a
wrong pid polls `lost`, an unknown work folder `gone`. `fetch` writes `out/result.txt` into the
local folder. Publishing dedupes by digest per machine (the size on first sight, 0 after), like a
real host's `code/<hash>` and `objects/<sha256>`. A call costs microseconds, so a load test can run
thousands at once. What a virtual machine ran lives in this process only: a controller that
restarts finds its jobs `gone`.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import trio

from actor_run.protocols.failures import MachineGone
from actor_run.protocols.files import write_all
from actor_run.protocols.hosts.base import RunResult
from actor_run.protocols.hosts.local import LocalHost
from actor_run.protocols.hosts.workspace import MAX_LOG_PER_POLL, HostBeat, Launch, PollResult, Record
from actor_run.protocols.offload import to_thread
from actor_run.protocols.verdict import OOM_KILLER_LINE


class Held(Protocol):
    """What the provider holds for a machine, as far as a guard cares."""

    @property
    def state(self) -> str: ...  # running | preempted
    @property
    def preempt_at(self) -> float | None: ...


class Provider(Protocol):
    """What a guard asks the sim provider (SimStore answers; its calls are small file reads)."""

    def path(self, name: str) -> Path: ...
    def read(self, name: str) -> Held | None: ...
    def preempt(self, name: str, now: float) -> None: ...
    def changes(self, name: str) -> tuple[int, int, int]: ...  # see SimStore.changes


class MachineGuard:
    """Raises `MachineGone` once the provider deleted or preempted the machine.

    Awaited before every call to the machine. While the provider's stamp of its record (other
    processes' changes to existing records, this process's to this one: SimStore.changes) is what
    it was when this guard last looked at the record, the record was not replaced or removed since:
    no system call. Otherwise one `stat` of the record, and a read if it changed.
    (A `stat` per call cost 20,000 system calls a second at 10,000 jobs polled every 0.5 s, each
    one a wait for the GIL when another thread computes; and while the folder's mtime was the
    sign, every create of a start burst moved it: bench/RESULTS.md.)
    """

    def __init__(self, provider: Provider, name: str, rec: Held, key: tuple[int, int, int] | None = None) -> None:
        """`key`: the record file's stat key as of `rec` (for a record just written), else a stat now."""
        self._provider = provider
        self._name = name
        self._rec = rec
        self._path = os.fspath(provider.path(name))  # a str: pathlib per call cost more than the stat
        self._key = key if key is not None else self._stat_key()
        self._stamp: tuple[int, int, int] | None = None  # the provider's stamp of the record when last looked at
        self._gone = ""
        self._gone_at: float | None = None  # preempted: when the provider took it

    def _stat_key(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    async def __call__(self) -> None:
        if not self.check_now():  # a preemption came due: the provider hears of it on a thread
            name = self._name
            at = self._rec.preempt_at
            now = time.time()
            await to_thread(self._provider.preempt, name, now)
            self._gone = f"sim: {name} was preempted"
            self._gone_at = now if at is None else min(now, at)  # what the provider bills up to
            raise MachineGone(self._gone, at=self._gone_at)

    def check_now(self) -> bool:
        """The guard without a wait: raises `MachineGone` as the call would; False when a preemption
        came due, which only the call records (the provider's write, on a thread)."""
        if self._gone:
            raise MachineGone(self._gone, at=self._gone_at)
        name = self._name
        stamp = self._provider.changes(name)  # before the record's stat: a change after it moves the stamp
        if stamp != self._stamp:
            key = self._stat_key()
            if key != self._key:
                rec = self._provider.read(name) if key is not None else None
                if rec is None:
                    self._gone = f"sim: {name} is gone (deleted)"
                    raise MachineGone(self._gone)
                self._rec, self._key = rec, key
            self._stamp = stamp
        at = self._rec.preempt_at
        return not (self._rec.state == "preempted" or (at is not None and time.time() >= at))


class SimHost:
    """A sandbox's LocalHost that first asks the provider whether the machine is still there."""

    def __init__(self, name: str, guard: MachineGuard) -> None:
        self.name = name
        self._guard = guard
        self._local = LocalHost(name)

    # the Host protocol's signature: the timeout is LocalHost's, applied per command
    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        await self._guard()
        result = await self._local.run(script, stdin=stdin, timeout=timeout)
        await self._guard()  # taken away meanwhile: a real machine would have dropped the call, not answered it
        return result

    async def put(self, local: Path, remote: str) -> int:
        await self._guard()
        return await self._local.put(local, remote)

    async def get_tar(self, remote_dir: str, names: list[str], local_tar: Path) -> int:
        await self._guard()
        return await self._local.get_tar(remote_dir, names, local_tar)

    async def wait_exit(self, pid: int) -> None:
        await self._guard()
        await self._local.wait_exit(pid)

    async def aclose(self) -> None:
        await self._local.aclose()


_pids = itertools.count(100_000)
_PROGRESS_LINE = b'{"stage":"train","step":%d}\n'  # what msgspec's encoder wrote for {"stage": "train", "step": k}
_LOG_LINE = b"virtual train step %d\n"


class VirtualJob:
    """One started job: when it started, what it said so far, how it ended.

    What it wrote is kept from the offset the last poll read from (`*_base`) on: a heartbeat reads
    each byte once, and a job of 300 s polled every 0.5 s wrote 32 KiB that its controller's memory
    held to the end, half of a load test's RSS per attempt at N=10,000 (bench/RESULTS.md, item 48).
    A read from before that offset renders the whole output again: it is a function of the steps."""

    __slots__ = ("attempt", "exit_code", "log", "log_base", "pid", "progress", "progress_base", "started", "steps")

    def __init__(self, pid: int, started: float, attempt: int = 0) -> None:
        self.pid = pid
        self.started = started
        self.attempt = attempt
        self.steps = 0
        self.exit_code: int | None = None
        self.progress = b""  # bytes, not a bytearray: a read of all of it is the object itself
        self.log = b""
        self.progress_base = self.log_base = 0  # bytes written before what `progress` / `log` hold

    def step(self) -> None:
        self.steps += 1
        self.progress += _PROGRESS_LINE % self.steps
        self.log += _LOG_LINE % self.steps

    def end(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self.log += b"virtual job exited %d\n" % code

    def sizes(self) -> tuple[int, int]:
        return self.progress_base + len(self.progress), self.log_base + len(self.log)

    def read(self, progress_at: int, log_at: int) -> tuple[bytes, bytes]:
        """What was written from each offset on; what lies before them is let go of."""
        if progress_at >= self.progress_base:
            cut = min(progress_at - self.progress_base, len(self.progress))
            progress = self.progress = self.progress[cut:]  # bytes: all of it when cut is 0, no copy
            self.progress_base += cut
        else:
            progress = b"".join(_PROGRESS_LINE % k for k in range(1, self.steps + 1))[progress_at:]
        if log_at >= self.log_base:
            cut = min(log_at - self.log_base, len(self.log))
            log = self.log = self.log[cut:]  # bytes: all of it when cut is 0, no copy
            self.log_base += cut
        else:
            whole = b"".join(_LOG_LINE % k for k in range(1, self.steps + 1))
            if self.exit_code is not None:
                whole += b"virtual job exited %d\n" % self.exit_code
            log = whole[log_at:]
        return progress, log


class VirtualMachine:
    """What one virtual machine holds: published digests and started jobs (by work folder)."""

    __slots__ = ("jobs", "published")

    def __init__(self) -> None:
        self.published: set[str] = set()
        self.jobs: dict[str, VirtualJob] = {}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(os.path.getsize(Path(d) / f) for d, _, files in os.walk(path) for f in files)


class VirtualWorkspace:
    """The Workspace of a virtual machine; `guard` raises `MachineGone` once the machine is gone."""

    def __init__(self, name: str, machine: VirtualMachine, guard: MachineGuard,
                 job_s: float, exit_code: int, sizes: dict[str, int],
                 write: Callable[[tuple[Path, dict[str, bytes]]], Awaitable[int]], *, oom: str = "",
                 retriable_attempts: int = 0) -> None:
        """`oom` (not ""): every job here is killed by the OOM killer at its end, this said why;
        `retriable_attempts`: a job of an attempt below it flags retriable and exits 1."""
        self._oom = oom
        self._retriable_attempts = retriable_attempts
        self.name = name
        self.root = f"/sim-virtual/{name}"
        self._machine = machine
        self._guard = guard
        self._job_s = job_s
        self._exit_code = exit_code
        self._sizes = sizes  # digest -> bytes, shared by every machine of the cloud
        self._write = write  # a Batch of write_files, shared by every machine of the cloud
        self.bytes_sent = 0

    async def prepare(self) -> str:
        await self._guard()
        return self.root

    def work_dir(self, job: str, seed: int, attempt: int) -> str:
        return f"{self.root}/work/{job}/{seed}/a{attempt}"

    async def _publish(self, path: Path, digest: str) -> int:
        await self._guard()
        if digest in self._machine.published:
            return 0
        if digest not in self._sizes:
            self._sizes[digest] = await to_thread(_size, path)
        self._machine.published.add(digest)
        self.bytes_sent += self._sizes[digest]
        return self._sizes[digest]

    async def publish_code(self, snapshot: Path, digest: str, tag: str) -> int:
        return await self._publish(snapshot, digest)

    async def publish_input(self, name: str, path: Path, digest: str, tag: str) -> int:
        return await self._publish(path, digest)

    def attach(self, work: str, handle: str) -> None:
        return None

    async def started(self, work: str) -> tuple[int, float]:
        """A virtual job lives in this process's memory: one started by a controller that died
        is gone with it, unless this machine is still the same object (then it is here)."""
        await self._guard()
        job = self._machine.jobs.get(work)
        return (job.pid, time.time()) if job is not None else (0, 0.0)

    async def start(self, launch: Launch, record: Record | None = None) -> int:
        await self._guard()
        attempt = launch.env.get("ACTOR_RUN_ATTEMPT", "0")
        job = VirtualJob(next(_pids), trio.current_time(), int(attempt) if attempt.isdigit() else 0)
        self._machine.jobs[launch.work] = job
        return job.pid

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int,
                   log_max: int = MAX_LOG_PER_POLL) -> PollResult:
        """All that is new (`log_max` aside: a virtual job's few lines are in memory already)."""
        await self._guard()
        return self._poll(work, pid, progress_at, log_at)

    def poll_now(self, work: str, pid: int, progress_at: int, log_at: int) -> PollResult | None:
        """`poll` without a wait (it has nothing to wait on: what the job wrote is in memory); None
        when the machine's preemption came due, which only `poll` records."""
        if not self._guard.check_now():
            return None
        return self._poll(work, pid, progress_at, log_at)

    def _poll(self, work: str, pid: int, progress_at: int, log_at: int) -> PollResult:
        job = self._machine.jobs.get(work)
        if job is None:
            return PollResult(state="gone", exit_code=None, progress=b"", log=b"",
                              progress_size=0, log_size=0)
        if job.pid != pid:  # not the job this caller started: like a real host's reused pid
            p_size, l_size = job.sizes()
            return PollResult(state="lost", exit_code=None, progress=b"", log=b"",
                              progress_size=p_size, log_size=l_size)
        if job.exit_code is None:
            job.step()
            if trio.current_time() - job.started >= self._job_s:
                self._end(job)
        p_size, l_size = job.sizes()
        progress, log = job.read(progress_at, log_at)
        return PollResult(
            state="running" if job.exit_code is None else "exited", exit_code=job.exit_code, progress=progress,
            log=log, progress_size=p_size, log_size=l_size,
        )

    def _end(self, job: VirtualJob) -> None:
        """The job's time is up: it ends as the sim's settings say (an OOM kill, a retriable flag, or
        `virtual_exit_code`)."""
        if self._oom:
            job.log += OOM_KILLER_LINE + f" ({self._oom}: an injected OOM kill)\n".encode()
            job.end(137)
        elif job.attempt < self._retriable_attempts:
            job.progress += b'{"retriable": true, "reason": "sim: an injected NCCL error"}\n'
            job.end(1)
        else:
            job.end(self._exit_code)

    async def beat(self, work: str) -> None:
        await self._guard()

    def beat_now(self, work: str) -> bool:
        """`beat` without a wait; False when only `beat` can say (a preemption came due)."""
        return self._guard.check_now()

    async def wait_exit(self, work: str, pid: int) -> None:
        """Until the job's time is up (or at once if it ended, or is not the job named)."""
        job = self._machine.jobs.get(work)
        if job is None or job.pid != pid or job.exit_code is not None:
            return
        await trio.sleep_until(job.started + self._job_s)

    def exit_at(self, work: str, pid: int) -> float | None:
        """The job's time is up then (known at its start): the heartbeat's loop wakes for it, and
        no task per job waits in `wait_exit` (-inf: ended already, or not the job named)."""
        job = self._machine.jobs.get(work)
        if job is None or job.pid != pid or job.exit_code is not None:
            return -math.inf
        return job.started + self._job_s

    async def stop(self, work: str) -> None:
        await self._guard()
        job = self._machine.jobs.get(work)
        if job is not None:
            job.end(143)

    async def fetch(self, work: str, local_dir: Path, names: list[str] | None = None) -> int:
        await self._guard()
        job = self._machine.jobs.get(work)
        if job is None:
            return 0
        files = {"out/result.txt": f"virtual result of {work}\n".encode()}
        # on a thread, with whatever other fetches are writing (one hand-off for all: a thousand
        # jobs end at once): the reactor must not wait on the disk
        return await self._write((local_dir, files))

    async def remove(self, work: str) -> None:
        await self._guard()
        self._machine.jobs.pop(work, None)

    async def last_beat(self) -> HostBeat | None:
        """A virtual machine's jobs live in its controller's memory: another process sees none (no proof)."""
        return None

    async def aclose(self) -> None:
        pass


def write_files(items: list[tuple[Path, dict[str, bytes]]]) -> list[int | BaseException]:
    """Each (folder, {relative path: bytes}): write the files; bytes written, or the error."""
    out: list[int | BaseException] = []
    made: set[str] = set()  # folders known to exist: one makedirs each per batch
    for local_dir, files in items:
        try:
            for rel, data in files.items():  # plain os calls: a thousand fetches end at once
                path = os.path.join(local_dir, rel)
                parent = os.path.dirname(path)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                write_all(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644), data)
            out.append(sum(len(data) for data in files.values()))
        except OSError as exc:
            out.append(exc)
    return out
