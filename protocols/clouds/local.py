"""The `local` cloud, the embedded default: each machine is a sandbox folder on this computer and
its host is a local `sh`. It runs the job for real and costs nothing.

Its machines live under `<state_dir>/local/`: `<name>/` is the machine's root, `<name>.json` its
record. Deleting a machine stops every process of each attempt started in its root (the sessions
and groups of the pids recorded at their start, and every process whose environment holds an
attempt's mark, however it detached: hosts/scripts.py MEMBERS) and removes both.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import time
from pathlib import Path

import msgspec
import psutil

from actor_run.protocols.clouds.capabilities import Cataloged, MachineChecking
from actor_run.protocols.clouds.verify import MachineCheck
from actor_run.protocols.failures import DeleteUnconfirmed, LaunchRefused
from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.local import LocalHost
from actor_run.protocols.hosts.workspace import ShellWorkspace, Workspace
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.offload import to_thread
from actor_run.protocols.specs import CandidateSpec


class LocalSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    state_dir: str = ""  # default: <actor-run state>/local
    max_machines: int = 64
    check_gpu: bool = False  # this computer promises no GPU; true: check it before each job (nvidia-smi)
    # this computer's GPUs, as a candidate names them: none unless said (a one-liner never runs here by default)
    gpus: list[str] = msgspec.field(default_factory=list)


# a pid file is written just after its process was made; a process made later than this after the
# file is another one that got the same pid (psutil's start times are good to a few jiffies)
PID_SLACK_S = 2.0


def started_groups(root: Path) -> list[int]:
    """The process groups the start script made under `root` (hosts/scripts.py): each attempt's job
    (`pid`) and its watchdog (`watchdog.pid`), each its own session, recorded as it was started."""
    groups = []
    for f in [*root.glob("work/*/*/a*/pid"), *root.glob("work/*/*/a*/watchdog.pid")]:
        try:
            pid = int(f.read_text().strip())
            written = f.stat().st_mtime
        except (OSError, ValueError):
            continue
        if pid <= 1 or pid == os.getpid():
            continue
        try:
            if psutil.Process(pid).create_time() > written + PID_SLACK_S:
                continue  # that pid is another process now
        except psutil.NoSuchProcess:
            pass  # the leader is gone; its group may not be (a pgid is not reused while it exists)
        groups.append(pid)
    return groups


def started_marks(root: Path) -> set[bytes]:
    """The marks (`ACTOR_RUN_TAG=<tag>`, as the job's environment holds them) of the attempts
    started under `root`: every process an attempt started inherits its mark, however it detached."""
    marks = set()
    for f in root.glob("work/*/*/a*/tag"):
        try:
            tag = f.read_text().strip()
        except OSError:
            continue
        if tag.startswith("actor-run-") and tag[10:].isalnum():
            marks.add(f"{scripts.MARK}={tag}".encode())
    return marks


def _marked(pid: int, marks: set[bytes]) -> bool:
    """Whether the process's environment (as it was exec'd: /proc/<pid>/environ) holds one of `marks`."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return not marks.isdisjoint(f.read().split(b"\0"))
    except OSError:
        return False


def attempt_processes(root: Path) -> list[psutil.Process]:
    """Every live process of the attempts started under `root`: the members of the sessions and
    groups recorded at their start (`started_groups`), and, on Linux, every process of this user
    whose environment holds an attempt's mark (`started_marks`). Never this process."""
    groups = set(started_groups(root))
    marks = started_marks(root) if os.path.isdir("/proc/self") else set()
    if not groups and not marks:
        return []
    pids = _proc_members(groups, marks) if os.path.isdir("/proc/self") else _psutil_members(groups)
    members = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            members.append(psutil.Process(pid))
    return members


def _proc_members(groups: set[int], marks: set[bytes]) -> list[int]:
    """`attempt_processes`' pids, read from /proc itself: one `stat` read per process (its state,
    group and session), its environment only for this user's processes outside those groups. psutil's
    walk read two files and built an object per process: 60 ms against 25 ms with 400 processes, and
    a delete on a busy computer walks it more than once."""
    me, uid = os.getpid(), os.getuid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            # `pid (comm) state ppid pgrp session ...`: comm may hold spaces and parentheses
            state, _ppid, pgrp, session = stat[stat.rindex(b")") + 2:].split(b" ", 4)[:4]
            if state == b"Z":
                continue
            # a group's members, and its leader itself: one just started may not have made its own
            # session yet (`setsid` runs after the fork that recorded its pid), its group then not
            # named by its pid, and a kill of the group alone would miss it
            grouped = pid in groups or int(pgrp) in groups or int(session) in groups
            if grouped or (marks and os.stat(f"/proc/{name}").st_uid == uid and _marked(pid, marks)):
                found.append(pid)
        except (OSError, ValueError):
            continue  # gone while read
    return found


def _psutil_members(groups: set[int]) -> list[int]:
    """`attempt_processes`' pids where there is no /proc (macOS): the recorded groups' members."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if proc.pid in groups or os.getpgid(proc.pid) in groups or os.getsid(proc.pid) in groups:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_processes_under(root: Path, wait_s: float = 10.0) -> int:
    """Stop every process of the attempts started under `root` (`attempt_processes`: the groups and
    sessions of the pids recorded at their start, never by what a command line says, and whatever
    holds an attempt's mark), and wait (up to `wait_s`) until each is dead: a SIGKILL is delivered at
    the process's next scheduling, so a busy machine may still show one running just after the
    kill. Found again until none is left (one forking as it died made another), up to `wait_s`."""
    groups = set(started_groups(root))
    members = attempt_processes(root)
    if not groups and not members:
        return 0
    found = {p.pid: p for p in members}
    deadline = time.monotonic() + wait_s
    while members and time.monotonic() < deadline:
        for proc in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGSTOP)  # stopped first: none forks while its fellows die
        for proc in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.01)
        members = [p for p in attempt_processes(root) if p.pid not in found or _alive(p)]
        found.update((p.pid, p) for p in members)
    members = list(found.values())
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while (alive := [p for p in members if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    if alive:
        raise DeleteUnconfirmed(f"local: {len(alive)} process(es) under {root} survived SIGKILL")
    return len(members)


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def remove_tree(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink():
                p.chmod(0o700)
    path.chmod(0o700)
    for _ in range(4):
        # a writer that was mid-write when its process was killed (or a heartbeat's stamp landing
        # as the folder goes) can leave a file behind a removed one: the folder is walked again
        try:
            shutil.rmtree(path)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    shutil.rmtree(path)


class LocalCloud(MachineChecking, Cataloged):
    name = "local"
    account = ""

    def __init__(self, settings: LocalSettings, state_dir: Path) -> None:
        self.settings = settings
        self.dir = (Path(settings.state_dir).expanduser() if settings.state_dir else state_dir / "local").resolve()

    def machine_check(self, offer: Offer) -> MachineCheck | None:
        """This computer's GPUs are checked only when `check_gpu = true` (its clock is ours)."""
        return MachineCheck(gpu=offer.gpu, check_clock=False) if self.settings.check_gpu else None

    @property
    def region_names(self) -> frozenset[str] | None:
        """This computer has no regions to check."""
        return None

    @property
    def gpu_names(self) -> frozenset[str]:
        """What a candidate's `gpu` may say here: only the GPUs `gpus` names (this computer claims none it has not)."""
        return frozenset(self.settings.gpus)

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        if candidate.gpu and candidate.gpu.lower() not in {g.lower() for g in self.settings.gpus}:
            return []
        return [Offer(cloud=self.name, region="this-computer", gpu=candidate.gpu, hourly_usd=0.0, candidate=index)]

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        def make() -> Machine:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if len(list(self.dir.glob("*.json"))) >= self.settings.max_machines:
                raise LaunchRefused(f"local: {self.settings.max_machines} machines already exist")
            root = self.dir / name
            root.mkdir(mode=0o700)
            machine = Machine(
                cloud=self.name, id=name, name=name, region=offer.region, gpu=offer.gpu, hourly_usd=0.0,
                deadline=deadline, created_at=time.time(), address="localhost", root=str(root),
            )
            (self.dir / f"{name}.json").write_bytes(msgspec.json.encode(machine))
            return machine

        return await to_thread(make)

    async def connect(self, machine: Machine) -> Workspace:
        ws = ShellWorkspace(LocalHost(machine.name), machine.root)
        await ws.prepare()
        return ws

    async def delete(self, name: str, machine_id: str = "") -> None:
        def rm() -> None:
            root = self.dir / name
            stop_processes_under(root)
            remove_tree(root)
            (self.dir / f"{name}.json").unlink(missing_ok=True)
            if root.exists() or (self.dir / f"{name}.json").exists():
                raise DeleteUnconfirmed(f"local: {root} is still there")

        await to_thread(rm)

    async def list_ours(self, prefix: str) -> list[Machine]:
        def ls() -> list[Machine]:
            out = []
            for p in sorted(self.dir.glob(f"{prefix}*.json")):
                try:
                    out.append(msgspec.json.decode(p.read_bytes(), type=Machine))
                except (OSError, msgspec.DecodeError):
                    continue
            return out

        return await to_thread(ls)

    async def aclose(self) -> None:
        pass
