"""A workspace: the job's operations on one machine, over any Host.

Layout under the machine's private root::

    code/<hash>/               a code snapshot, published once per host, read-only
    objects/<sha256>/data      an input, published once per host, verified on arrival, read-only
    work/<job>/<seed>/a<n>/    one attempt: in/ (links to objects), out/, log.txt, progress.jsonl,
                               alive (the controller's heartbeat: unix time, host clock), lost_after
                               (the controller's `lost_after_s`), pid, response.json (exit code)

Publishing is an atomic rename of a `.incoming-<tag>` folder; an upload that fails or is cancelled
removes its incoming folder. The sim cloud's virtual machines implement the same protocol in memory.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec
import trio

from actor_run.protocols.failures import Code, Refused, Unreachable
from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.base import Host
from actor_run.protocols.messages import InputRef
from actor_run.protocols.offload import to_thread

if TYPE_CHECKING:  # tarfile (and gzip, bz2, lzma) loads with the first fetch: a sweep or a check never fetches
    import tarfile

KEEP_S = 24 * 3600
RESUME_LINE = "progress.json"  # in a checkpoint folder: the progress line that named it
MAX_LOG_PER_POLL = 1 << 20  # what one poll reads at most of each file: a job's output is never held whole
MAX_PROGRESS_PER_POLL = 1 << 20


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """What `start` needs: the command and environment, the code and inputs by hash."""

    work: str
    command: str
    code: str | None  # hash, or None for no code folder
    inputs: list[InputRef]
    env: dict[str, str]
    lost_after_s: float
    request: bytes = b"{}"
    resume: InputRef | None = None  # a checkpoint from an earlier attempt: linked as in/resume


class PollResult(msgspec.Struct, frozen=True, kw_only=True):
    state: str  # running | exited | lost | gone
    exit_code: int | None
    progress: bytes
    log: bytes
    progress_size: int
    log_size: int
    progress_mtime: float = 0.0  # unix times of the last write to each (0: unknown)
    log_mtime: float = 0.0
    billed_s: float = -1.0  # at the end of a run the provider bills by the second: its seconds (-1: not so)
    # the log's whole size on the machine, read or not (-1: this workspace reads it all, whatever `log_max`)
    log_total: int = -1


Record = Callable[[str], Awaitable[None]]  # makes a run's handle durable (the ledger) before start returns


class HostBeat(msgspec.Struct, frozen=True, kw_only=True):
    """The newest controller heartbeat on a machine, as its host's watchdog reads it: its age by the
    host's own clock, and the `lost_after_s` its controller wrote beside it (None: not written)."""

    age_s: float
    lost_after_s: float | None = None


def parse_beats(text: str) -> HostBeat | None:
    """What `scripts.beats` printed: `now <t>`, then `<stamp> <lost_after or ->` per attempt folder."""
    lines = text.split("\n")
    head = lines[0].split()
    if len(head) != 2 or head[0] != "now" or not head[1].isdigit():
        return None
    now = int(head[1])
    best: tuple[int, float | None] | None = None
    for line in lines[1:]:
        words = line.split()
        if len(words) != 2 or not words[0].isdigit():
            continue
        stamp = int(words[0])
        lost = float(words[1]) if words[1].replace(".", "", 1).isdigit() else None
        if best is None or stamp > best[0]:
            best = (stamp, lost)
    if best is None:
        return None
    return HostBeat(age_s=float(now - best[0]), lost_after_s=best[1])


class Workspace(Protocol):
    root: str

    async def prepare(self) -> str: ...
    def work_dir(self, job: str, seed: int, attempt: int) -> str: ...
    async def publish_code(self, snapshot: Path, digest: str, tag: str) -> int: ...
    async def publish_input(self, name: str, path: Path, digest: str, tag: str) -> int: ...
    async def start(self, launch: Launch, record: Record | None = None) -> int:
        """Start the job; its pid. A workspace whose run is named by a handle the provider hands out
        (a queue job) awaits `record(handle)` before it returns, so no crash can lose the handle."""
        ...

    def attach(self, work: str, handle: str) -> None:
        """Follow a run an earlier controller started, by the handle it recorded ("" for none)."""
        ...

    async def started(self, work: str) -> tuple[int, float]:
        """A job an earlier controller started in `work` and died before recording: its pid and
        when it started (unix time), or (0, 0.0) when none was started there (a start cut off half
        way has what it launched ended first: the caller starts the job afresh)."""
        ...

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int,
                   log_max: int = MAX_LOG_PER_POLL) -> PollResult:
        """The job's state and what is new in its progress file and log (at most `log_max` bytes of
        the log, where the workspace says `log_total`)."""
        ...

    async def beat(self, work: str) -> None: ...

    async def wait_exit(self, work: str, pid: int) -> None:
        """Return once the job may have ended (a hint: the next poll says what happened); a
        workspace that cannot tell waits until cancelled, and the job is seen at a poll."""
        ...

    def exit_at(self, work: str, pid: int) -> float | None:
        """What the heartbeat needs to know before it waits for an exit hint (any thread, no I/O):
        the moment on trio's clock the job will have ended, when the workspace knows it in advance
        (a virtual job); `math.inf` when it cannot tell at all (`wait_exit` would wait forever: the
        polls see the end, and nothing need wait); None when `wait_exit` is the way to know."""
        ...

    async def stop(self, work: str) -> None: ...
    async def fetch(self, work: str, local_dir: Path, names: list[str] | None = None) -> int: ...
    async def remove(self, work: str) -> None: ...

    async def last_beat(self) -> HostBeat | None:
        """The newest controller heartbeat stamp among this machine's attempt folders (None: no
        attempt has one). Read by sweeps: a stamp older than its `lost_after_s` proves the machine
        abandoned."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PollsNow(Protocol):
    """A workspace whose poll has nothing to wait on (a virtual machine's jobs live in this process's
    memory): the heartbeat steps it in the shared clock's pass, with no task of its own (trio's wait,
    reschedule and task switch per poll were 30 % of the CPU between the bursts of a load test at
    N=3000: bench/RESULTS.md item 65). On the reactor
    thread; no I/O beyond what `poll` does there itself. A workspace whose poll talks to a machine
    (a shell, SSH) is not one: its polls stay on a task each, so one slow machine delays no other."""

    def poll_now(self, work: str, pid: int, progress_at: int, log_at: int) -> PollResult | None:
        """What `poll` answers, at once; None when this one needs `poll` (a wait)."""
        ...

    def beat_now(self, work: str) -> bool:
        """`beat`, at once; False when this one needs `beat` (a wait)."""
        ...


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files and folders only: a link the job made is never followed nor recreated."""
    out = []
    for m in tar.getmembers():
        if not (m.isfile() or m.isdir()):
            continue
        if m.name.startswith("/") or ".." in Path(m.name).parts:
            continue
        out.append(m)
    return out


class ShellWorkspace:
    """The workspace of a real machine (this computer's sandbox, an SSH host, a cloud VM)."""

    def __init__(self, host: Host, root: str) -> None:
        self.host = host
        self.root = root  # absolute after prepare()
        self.bytes_sent = 0

    async def _sh(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> str:
        res = await self.host.run(script, stdin=stdin, timeout=timeout)
        if res.exit_code == scripts.EXIT_GUARD:
            raise Refused(Code.GUARD, res.error_text())
        if res.exit_code == scripts.EXIT_INPUT:
            raise Refused(Code.INPUT, res.error_text())
        if res.exit_code != 0:
            raise Unreachable(f"{self.host.name}: script exited {res.exit_code}: {res.error_text()}")
        return res.text()

    async def prepare(self) -> str:
        out = await self._sh("set -- " + scripts.q(self.root) + "\n" + scripts.ROOT)
        self.root = out.strip().splitlines()[-1]
        return self.root

    def work_dir(self, job: str, seed: int, attempt: int) -> str:
        return f"{self.root}/work/{job}/{seed}/a{attempt}"

    def work_base(self) -> str:
        """The folder this machine's attempt folders are under."""
        return f"{self.root}/work"

    async def _publish(self, folder: str, incoming: str, send: Path, dest: str, finish: str) -> int:
        if (await self._sh(scripts.have(folder, incoming))).strip() == "have":
            return 0
        done = False
        try:
            sent = await self.host.put(send, dest)
            await self._sh(finish)
            done = True
            self.bytes_sent += sent
            return sent
        finally:
            if not done:
                # unreachable: the next upload of the same object starts from `rm -rf` of its incoming
                with trio.CancelScope(shield=True), trio.move_on_after(10), contextlib.suppress(Unreachable):
                    await self.host.run(scripts.discard(incoming), timeout=10)

    async def publish_code(self, snapshot: Path, digest: str, tag: str) -> int:
        folder, incoming = f"{self.root}/code/{digest}", f"{self.root}/code/.incoming-{tag}"
        return await self._publish(folder, incoming, snapshot, incoming, scripts.publish_code(incoming, folder))

    async def publish_input(self, name: str, path: Path, digest: str, tag: str) -> int:
        folder, incoming = f"{self.root}/objects/{digest}", f"{self.root}/objects/.incoming-{tag}-{name}"
        finish = scripts.publish_input(incoming, folder, digest, name, path.is_file())  # noqa: ASYNC240 - one stat: a thread hop costs more
        # the incoming folder is made by put() of a file into incoming/data
        return await self._publish(folder, incoming, path, f"{incoming}/data", finish)

    def attach(self, work: str, handle: str) -> None:
        return None  # the work folder and the pid are all a machine's job needs

    async def started(self, work: str) -> tuple[int, float]:
        words = (await self._sh(scripts.started(work), timeout=30)).split()
        if len(words) < 2 or not words[0].isdigit() or not words[1].isdigit():
            return 0, 0.0
        return int(words[0]), float(words[1])

    async def start(self, launch: Launch, record: Record | None = None) -> int:
        links = [
            (f"{self.root}/objects/{i.sha256}/data", f"{launch.work}/in/{i.name}/{i.basename}") for i in launch.inputs
        ]
        cwd = f"{self.root}/code/{launch.code}" if launch.code else f"{launch.work}/out"
        env = {**launch.env, "ACTOR_RUN_IN": f"{launch.work}/in", "ACTOR_RUN_OUT": f"{launch.work}/out",
               "ACTOR_RUN_PROGRESS": f"{launch.work}/progress.jsonl"}
        if launch.resume is not None:
            links.append((f"{self.root}/objects/{launch.resume.sha256}/data", f"{launch.work}/in/resume"))
            env["ACTOR_RUN_RESUME"] = f"{launch.work}/in/resume/{RESUME_LINE}"
        lost = int(launch.lost_after_s + min(60.0, launch.lost_after_s))  # after the controller gave up
        every = max(1, min(30, lost // 4))
        out = await self._sh(
            scripts.start(launch.work, cwd, launch.command, env, links, lost, every, KEEP_S, "",
                          lost_after_s=int(launch.lost_after_s)),
            stdin=launch.request,
        )
        return int(out.split()[-1])

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int,
                   log_max: int = MAX_LOG_PER_POLL) -> PollResult:
        log_max = max(0, min(log_max, MAX_LOG_PER_POLL))
        res = await self.host.run(scripts.poll(work, pid, progress_at, log_at, log_max, MAX_PROGRESS_PER_POLL),
                                  timeout=60)
        if res.exit_code != 0:
            raise Unreachable(f"{self.host.name}: poll exited {res.exit_code}: {res.error_text()}")
        out = res.stdout
        first, _, rest = out.partition(b"\n")
        sizes, _, body = rest.partition(b"\n")
        words = first.decode().split()
        state = words[0] if words else "lost"
        code = int(words[1]) if state == "exited" and len(words) > 1 and words[1].lstrip("-").isdigit() else None
        nums = [int(x) for x in sizes.split()] + [0, 0, 0, 0, -1]
        p_size, l_size, p_mtime, l_mtime, l_total = nums[:5]
        n_progress = max(0, p_size - progress_at)
        return PollResult(
            state=state, exit_code=code, progress=body[:n_progress], log=body[n_progress:],
            progress_size=p_size, log_size=l_size, progress_mtime=float(p_mtime), log_mtime=float(l_mtime),
            log_total=max(l_total, l_size),
        )

    async def beat(self, work: str) -> None:
        await self._sh(scripts.alive(work), timeout=30)

    async def wait_exit(self, work: str, pid: int) -> None:
        """The host's `wait_exit(pid)` where it has one (this computer's processes); else never."""
        wait = getattr(self.host, "wait_exit", None)
        if wait is not None:
            await wait(pid)
        else:
            await trio.sleep_forever()

    def exit_at(self, work: str, pid: int) -> float | None:
        """None where the host can wait for a process (this computer's); else `math.inf` (an SSH
        host: the polls see the end, and no task need wait for a hint that never comes)."""
        return None if hasattr(self.host, "wait_exit") else math.inf

    async def stop(self, work: str) -> None:
        await self._sh(scripts.stop(work), timeout=30)

    async def fetch(self, work: str, local_dir: Path, names: list[str] | None = None) -> int:
        """out/ and progress.jsonl (or the given paths under the attempt's folder), never through a link."""
        names = (await self._sh(scripts.fetchable(work, names))).split()
        if not names:
            return 0
        local_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - one mkdir: a thread hop costs more
        with tempfile.TemporaryDirectory(prefix="actor-run-fetch-") as tmp:
            tar_path = Path(tmp) / "fetch.tar"
            received = await self.host.get_tar(work, names, tar_path)
            await to_thread(_extract, tar_path, local_dir, names)
        return received

    async def remove(self, work: str) -> None:
        await self._sh(scripts.remove(work), timeout=60)

    async def last_beat(self) -> HostBeat | None:
        return parse_beats(await self._sh(scripts.beats(self.work_base()), timeout=30))

    async def aclose(self) -> None:
        await self.host.aclose()


def _extract(tar_path: Path, dest: Path, names: list[str]) -> None:
    """Only what was asked for: the fetch lands in the seed's own folder, beside the controller's
    log.txt and response.json, which a tar from the machine must not be able to replace."""
    import tarfile

    asked = [n.rstrip("/") for n in names]
    with tarfile.open(tar_path) as tar:
        members = [m for m in _safe_members(tar)
                   if any(m.name.rstrip("/") == n or m.name.startswith(n + "/") for n in asked)]
        tar.extractall(dest, members=members, filter="data")
