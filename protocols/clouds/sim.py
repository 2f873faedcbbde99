"""The `sim` cloud: a simulated GPU provider for dry runs, demos, chaos tests and load tests.

Settings (`[clouds.sim]`), every field optional; a rate is a probability per launch::

    state_dir = ""              # default: <actor-run state>/sim
    seed = 7                    # set: each machine's fate is a function of (seed, name); unset: random
    no_capacity_rate = 0.0      # the launch is refused cleanly: `no_capacity`, no machine
    launch_failure_rate = 0.0   # the launch is refused cleanly: `launch_failed`, no machine
    ambiguous_rate = 0.0        # the machine is made, then the launch raises `LaunchAmbiguous`
    boot_failure_rate = 0.0     # the launch returns a machine that never answers: `connect` raises
                                # `Unreachable` (it holds stock and bills until deleted)
    preempt_rate = 0.0          # the machine is preempted at a random moment within preempt_within_s
    preempt_within_s = 30.0
    launch_latency_s = 0.2
    delete_latency_s = 0.05
    virtual = false             # machines only pretend to run (clouds/virtual.py); else local sandboxes
    virtual_job_s = 1.0         # how long a virtual job runs
    virtual_exit_code = 0

    [[clouds.sim.regions]]      # default: us-east, eu-west, ap-south with A100s and H100s
    name = "us-east"
    gpus = { A100 = { stock = 8, hourly_usd = 1.8 }, H100 = { stock = 4, hourly_usd = 2.9 } }

State lives in the sim's folder, not in the process, so a killed controller leaves its machines
behind exactly as at a real provider, and two controllers share one sim cloud::

    lock                  flock'ed around every change (threads and processes)
    machines/<name>.json  one per machine the provider holds: the Machine fields, `state`
                          (running | preempted), `preempt_at`, `virtual`, `broken`
    held.json             machines held per "region/gpu": stock left is stock - held
    billing.jsonl         one line per deleted machine (`Billing`)
    sandboxes/<name>/     a real machine's root (mode 0700), as in the local cloud
    fail_deletes          while this file exists every delete raises `DeleteUnconfirmed`

A machine holds stock from its launch to its deletion, preempted or not. Preemption is noticed by
the next call to the machine (a host call, a virtual workspace call): its processes are stopped,
its state becomes `preempted` and the call raises `MachineGone`; until deleted it is still listed.
Billing runs from the launch to the deletion, or to the preemption if that came first. `seed`
makes fates independent of the order of launches: a retry has a new name, hence a new fate. A
machine's deadline is recorded, not enforced (no self-destruct): a sweep finds it past its deadline.
`list_ours` also counts held.json again from the machine files (a crash between the two writes).

Chaos helpers for tests and benches (synchronous, on the sim's folder `SimCloud.dir`):
`preempt_machine` preempts one machine now, `set_fail_deletes` switches the provider outage on or
off, `sim_machines` names the machines held, `billed_seconds` totals billing.jsonl.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import trio

from protocols.clouds.batch import Batch
from protocols.clouds.local import remove_tree, stop_processes_under
from protocols.clouds.virtual import MachineGuard, SimHost, VirtualMachine, VirtualWorkspace, write_files
from protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchError,
    LaunchRefused,
    MachineGone,
    SpecError,
    Unreachable,
)
from protocols.hosts.workspace import ShellWorkspace, Workspace
from protocols.messages import Machine, Offer
from protocols.specs import CandidateSpec

_RATES = ("no_capacity_rate", "launch_failure_rate", "ambiguous_rate", "boot_failure_rate", "preempt_rate")
_DURATIONS = ("preempt_within_s", "launch_latency_s", "delete_latency_s", "virtual_job_s")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class SimGpu(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    stock: int
    hourly_usd: float


class SimRegion(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    gpus: dict[str, SimGpu]


def _default_regions() -> list[SimRegion]:
    return [
        SimRegion(name="us-east", gpus={"A100": SimGpu(stock=8, hourly_usd=1.8),
                                        "H100": SimGpu(stock=4, hourly_usd=2.9)}),
        SimRegion(name="eu-west", gpus={"A100": SimGpu(stock=4, hourly_usd=2.1),
                                        "H100": SimGpu(stock=2, hourly_usd=3.2)}),
        SimRegion(name="ap-south", gpus={"A100": SimGpu(stock=2, hourly_usd=1.5)}),
    ]


class SimSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    state_dir: str = ""  # default: <actor-run state>/sim
    regions: list[SimRegion] = msgspec.field(default_factory=_default_regions)
    no_capacity_rate: float = 0.0
    launch_failure_rate: float = 0.0
    ambiguous_rate: float = 0.0
    boot_failure_rate: float = 0.0
    preempt_rate: float = 0.0
    preempt_within_s: float = 30.0
    launch_latency_s: float = 0.2
    delete_latency_s: float = 0.05
    seed: int | None = None
    virtual: bool = False
    virtual_job_s: float = 1.0
    virtual_exit_code: int = 0

    def __post_init__(self) -> None:
        for field in _RATES:
            value = getattr(self, field)
            if not 0.0 <= value <= 1.0:
                raise SpecError(f"clouds.sim.{field}", f"expected number between 0 and 1, got {value}")
        for field in _DURATIONS:
            value = getattr(self, field)
            if value < 0:
                raise SpecError(f"clouds.sim.{field}", f"expected number >= 0, got {value}")


class SimRecord(Machine, frozen=True, kw_only=True):
    """What the provider holds for one machine: `machines/<name>.json`."""

    state: str = "running"  # running | preempted
    preempt_at: float | None = None  # unix time the provider takes it away
    virtual: bool = False
    broken: bool = False  # an injected boot failure: it never answers


class Billing(msgspec.Struct, frozen=True, kw_only=True):
    """One line of billing.jsonl: a deleted machine."""

    name: str
    id: str
    region: str
    gpu: str
    created_at: float
    deleted_at: float
    seconds: float
    usd: float
    preempted: bool = False


class _Fate(msgspec.Struct, frozen=True, kw_only=True):
    no_capacity: bool
    failed: bool
    ambiguous: bool
    broken: bool
    preempt_in: float | None


_record_decoder = msgspec.json.Decoder(SimRecord)
_billing_decoder = msgspec.json.Decoder(Billing)
_held_decoder = msgspec.json.Decoder(dict[str, int])


StatKey = tuple[int, int, int]  # (inode, mtime_ns, size) of a record file


def _place(region: str, gpu: str) -> str:
    return f"{region}/{gpu.lower()}"


def _bill(rec: SimRecord, now: float) -> Billing:
    end = now if rec.preempt_at is None else min(now, rec.preempt_at)
    seconds = max(0.0, end - rec.created_at)
    return Billing(
        name=rec.name, id=rec.id, region=rec.region, gpu=rec.gpu, created_at=rec.created_at,
        deleted_at=now, seconds=seconds, usd=seconds * rec.hourly_usd / 3600, preempted=end < now,
    )


def _machine(rec: SimRecord) -> Machine:
    return Machine(**{f: getattr(rec, f) for f in Machine.__struct_fields__})


class SimStore:
    """The sim's folder: synchronous file work. The cloud runs in a thread whatever takes the lock
    or may take long; `read`, `held_advice` and the guards' `stat` are one small file each and run
    on the reactor."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.machines = root / "machines"
        self.sandboxes = root / "sandboxes"
        self.machines.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._mutex = threading.Lock()  # this process's threads queue here, not all on the flock
        self._lock_fd: int | None = None  # opened once: an open and a close per call cost more than the lock

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._mutex:
            if self._lock_fd is None:
                self._lock_fd = os.open(self.root / "lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._mutex:
            fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def path(self, name: str) -> Path:
        return self.machines / f"{name}.json"

    def read(self, name: str) -> SimRecord | None:
        if not _SAFE_NAME.fullmatch(name):
            return None
        try:
            return _record_decoder.decode(self.path(name).read_bytes())
        except FileNotFoundError:
            return None

    def records(self) -> list[SimRecord]:
        out = []
        for p in sorted(self.machines.glob("*.json")):
            with contextlib.suppress(FileNotFoundError):  # deleted while we listed
                out.append(_record_decoder.decode(p.read_bytes()))
        return out

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def held(self) -> dict[str, int]:
        """Machines held per place, read under the lock (held.json is rewritten in place)."""
        with self.locked():
            return self._held_locked()

    def held_advice(self) -> dict[str, int] | None:
        """Machines held per place, read without the lock: None if caught mid-write. Good for
        offers, which are advice (a launch decides under the lock); costs one small read."""
        try:
            return _held_decoder.decode((self.root / "held.json").read_bytes())
        except FileNotFoundError:
            return {}
        except msgspec.DecodeError:
            return None

    def _held_locked(self) -> dict[str, int]:
        try:
            return _held_decoder.decode((self.root / "held.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):  # a crash mid-write: count again
            return self._recount()

    def _recount(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for rec in self.records():
            held[_place(rec.region, rec.gpu)] = held.get(_place(rec.region, rec.gpu), 0) + 1
        return held

    def _save_held(self, held: dict[str, int]) -> None:
        # in place, not by rename: ext4 flushes a file renamed over another (about 1 ms a launch)
        data = msgspec.json.encode({k: v for k, v in held.items() if v > 0})
        fd = os.open(self.root / "held.json", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def create_many(self, items: list[tuple[SimRecord, int, _Fate]]) -> list[LaunchError | StatKey]:
        """Make each machine (answering its record file's stat key), or answer the provider's
        refusal (which proves no machine was made); all under one lock. Stock is counted (held.json) before the records appear: a crash between
        over-counts, which `listing` repairs."""
        # the records are written before taking the lock: creating a file is the slow part
        tmps = []
        for rec, _, _ in items:
            tmp = self.machines / f".{rec.name}.{uuid.uuid4().hex}.tmp"
            tmp.write_bytes(msgspec.json.encode(rec))
            tmps.append(tmp)
        out: list[LaunchError | StatKey] = []
        try:
            with self.locked():
                held, made = self._held_locked(), set()
                refusals = [self._admit(rec, stock, fate, held, made) for rec, stock, fate in items]
                if made:
                    self._save_held(held)
                for (rec, _, _), tmp, refusal in zip(items, tmps, refusals, strict=True):
                    if refusal is not None:
                        out.append(refusal)
                        continue
                    path = self.path(rec.name)
                    os.replace(tmp, path)
                    st = os.stat(path)
                    out.append((st.st_ino, st.st_mtime_ns, st.st_size))
                    if not rec.virtual:
                        (self.sandboxes / rec.name).mkdir(parents=True, mode=0o700)
        finally:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
        return out

    def _admit(self, rec: SimRecord, stock: int, fate: _Fate, held: dict[str, int], made: set[str]) -> LaunchError | None:
        if rec.name in made or self.path(rec.name).exists():
            return LaunchAmbiguous(f"sim: a machine named {rec.name} exists already")
        place = _place(rec.region, rec.gpu)
        if fate.no_capacity or held.get(place, 0) >= stock:
            return LaunchRefused(f"sim: no {rec.gpu} left in {rec.region}", code=Code.NO_CAPACITY)
        if fate.failed:
            return LaunchRefused(f"sim: {rec.name} did not come up (injected)", code=Code.LAUNCH_FAILED)
        held[place] = held.get(place, 0) + 1
        made.add(rec.name)
        return None

    def delete_many(self, items: list[tuple[str, float]]) -> list[DeleteUnconfirmed | None]:
        """Remove each machine (name, when asked), its sandbox and its stock, bill it, and check it
        is gone; all under one lock. held.json is written once at the end: a crash before
        over-counts, which `listing` repairs."""
        if (self.root / "fail_deletes").exists():
            return [DeleteUnconfirmed("sim: the provider refused the delete (injected)") for _ in items]
        out: list[DeleteUnconfirmed | None] = []
        with self.locked(), open(self.root / "billing.jsonl", "ab", buffering=0) as bills:
            held, changed = self._held_locked(), False
            for name, now in items:
                if not _SAFE_NAME.fullmatch(name):
                    out.append(None)  # no machine can have this name
                    continue
                sandbox = self.sandboxes / name
                rec = self.read(name)
                if sandbox.exists():
                    stop_processes_under(sandbox)
                    remove_tree(sandbox)
                if rec is not None:
                    self.path(name).unlink()
                    place = _place(rec.region, rec.gpu)
                    held[place] = held.get(place, 0) - 1
                    changed = True
                    bills.write(msgspec.json.encode(_bill(rec, now)) + b"\n")
                gone = not (self.path(name).exists() or sandbox.exists())
                out.append(None if gone else DeleteUnconfirmed(f"sim: {name} is still there"))
            if changed:
                self._save_held(held)
        return out

    def preempt(self, name: str, now: float) -> None:
        """Take the machine away now: mark it preempted (it stays listed), then stop its processes.
        In this order, so a poll never finds the job gone on a machine that still looks up."""
        with self.locked():
            rec = self.read(name)
            if rec is not None and rec.state != "preempted":
                at = now if rec.preempt_at is None else min(now, rec.preempt_at)
                self._write(self.path(name), msgspec.json.encode(
                    msgspec.structs.replace(rec, state="preempted", preempt_at=at)))
        sandbox = self.sandboxes / name
        if sandbox.exists():
            stop_processes_under(sandbox)

    def listing(self, prefix: str) -> list[SimRecord]:
        """Every machine whose name starts with `prefix`; repairs held.json on the way."""
        with self.locked():
            records = self.records()
            held = self._recount()
            if held != {k: v for k, v in self._held_locked().items() if v > 0}:
                self._save_held(held)
        return [r for r in records if r.name.startswith(prefix)]


class SimCloud:
    """The simulated provider (see the module docstring); its state is in `self.dir`."""

    name = "sim"

    def __init__(self, settings: SimSettings, state_dir: Path) -> None:
        self.settings = settings
        own = Path(settings.state_dir).expanduser() if settings.state_dir else state_dir / "sim"
        self.dir = own.resolve()
        self._store = SimStore(self.dir)
        self._rng = random.Random(settings.seed)
        self._places = {
            _place(r.name, g): (r.name, g, spec) for r in settings.regions for g, spec in r.gpus.items()
        }
        self._virtual: dict[str, VirtualMachine] = {}
        self._sizes: dict[str, int] = {}  # digest -> bytes, for virtual publishing
        # creates and deletes that come while one batch is in the store go together in the next
        self._creates = Batch(self._store.create_many)
        self._deletes = Batch(self._store.delete_many)
        self._fetch_writes = Batch(write_files)  # what virtual machines' fetches write locally
        self._fresh: dict[str, tuple[SimRecord, StatKey]] = {}  # made by launch, not yet connected

    def _fate(self, name: str) -> _Fate:
        s = self.settings
        # crc32 rather than the string itself: seeding from a str hashes it with sha512 (3 % of a
        # thousand launches)
        rng = random.Random(zlib.crc32(f"{s.seed}/{name}".encode())) if s.seed is not None else self._rng
        u = [rng.random() for _ in range(6)]
        return _Fate(
            no_capacity=u[0] < s.no_capacity_rate, failed=u[1] < s.launch_failure_rate,
            ambiguous=u[2] < s.ambiguous_rate, broken=u[3] < s.boot_failure_rate,
            preempt_in=u[5] * s.preempt_within_s if u[4] < s.preempt_rate else None,
        )

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        held = self._store.held_advice()
        if held is None:
            held = await trio.to_thread.run_sync(self._store.held)
        out = []
        for key, (region, gpu, spec) in self._places.items():
            if candidate.regions and region not in candidate.regions:
                continue
            if candidate.gpu and gpu.lower() != candidate.gpu.lower():
                continue
            if spec.stock - held.get(key, 0) <= 0:
                continue
            if candidate.max_hourly_usd is not None and spec.hourly_usd > candidate.max_hourly_usd:
                continue
            out.append(
                Offer(cloud=self.name, region=region, gpu=gpu, hourly_usd=spec.hourly_usd, candidate=index)
            )
        out.sort(key=lambda o: (o.hourly_usd, o.region, o.gpu))
        return out

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        place = self._places.get(_place(offer.region, offer.gpu))
        if place is None:
            raise LaunchRefused(f"sim: no {offer.gpu!r} in region {offer.region!r}", code=Code.NO_CAPACITY)
        if not _SAFE_NAME.fullmatch(name):
            raise LaunchRefused(f"sim: {name!r} is not a valid machine name", code=Code.LAUNCH_FAILED)
        region, gpu, spec = place
        fate = self._fate(name)
        await trio.sleep(self.settings.launch_latency_s)
        now = time.time()
        virtual = self.settings.virtual
        rec = SimRecord(
            cloud=self.name, id=f"sim-{uuid.uuid4().hex[:16]}", name=name, region=region, gpu=gpu,
            hourly_usd=spec.hourly_usd, deadline=deadline, created_at=now, address="localhost",
            root=f"/sim-virtual/{name}" if virtual else str(self._store.sandboxes / name),
            preempt_at=None if fate.preempt_in is None else now + fate.preempt_in,
            virtual=virtual, broken=fate.broken,
        )
        made = await self._creates((rec, spec.stock, fate))
        if isinstance(made, LaunchError):
            raise made
        if fate.ambiguous:
            raise LaunchAmbiguous(f"sim: the create of {name} timed out (injected); the machine may exist")
        self._fresh[name] = (rec, made)  # connect() starts from it instead of reading it back
        return _machine(rec)

    async def connect(self, machine: Machine) -> Workspace:
        # a machine this cloud just made: its record as written, and the guard's first call (the
        # workspace's prepare) stats it, so a change since (deleted, preempted) is seen there
        fresh = self._fresh.pop(machine.name, None)
        rec, key = fresh if fresh is not None else (self._store.read(machine.name), None)  # one small file
        if rec is None:
            raise MachineGone(f"sim: {machine.name} is gone (deleted)")
        if rec.broken:
            raise Unreachable(f"sim: {machine.name} does not answer (injected boot failure)")
        guard = MachineGuard(self._store, rec.name, rec, key)
        ws: VirtualWorkspace | ShellWorkspace
        if rec.virtual:
            vm = self._virtual.setdefault(rec.name, VirtualMachine())
            ws = VirtualWorkspace(rec.name, vm, guard, self.settings.virtual_job_s,
                                  self.settings.virtual_exit_code, self._sizes, self._fetch_writes)
        else:
            ws = ShellWorkspace(SimHost(rec.name, guard), rec.root)
        try:
            await ws.prepare()
        except BaseException:
            with trio.CancelScope(shield=True):
                await ws.aclose()
            raise
        return ws

    async def delete(self, name: str, machine_id: str = "") -> None:
        await trio.sleep(self.settings.delete_latency_s)
        unconfirmed = await self._deletes((name, time.time()))
        if unconfirmed is not None:
            raise unconfirmed
        self._virtual.pop(name, None)
        self._fresh.pop(name, None)

    async def list_ours(self, prefix: str) -> list[Machine]:
        return [_machine(r) for r in await trio.to_thread.run_sync(self._store.listing, prefix)]

    async def aclose(self) -> None:
        self._store.close()


# --- synchronous helpers for tests and benches: `sim_dir` is the sim's folder (SimCloud.dir) ----


def sim_machines(sim_dir: Path) -> list[str]:
    """Names of the machines the sim provider holds now (preempted ones included)."""
    return sorted(p.name.removesuffix(".json") for p in (sim_dir / "machines").glob("*.json"))


def billing(sim_dir: Path) -> list[Billing]:
    try:
        lines = (sim_dir / "billing.jsonl").read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [_billing_decoder.decode(line) for line in lines if line.strip()]


def billed_seconds(sim_dir: Path) -> float:
    """Machine-seconds billed so far (deleted machines only)."""
    return sum(line.seconds for line in billing(sim_dir))


def preempt_machine(sim_dir: Path, name: str) -> bool:
    """Preempt one machine now; False if the provider holds no such machine."""
    store = SimStore(sim_dir)
    try:
        if store.read(name) is None:
            return False
        store.preempt(name, time.time())
        return True
    finally:
        store.close()


def set_fail_deletes(sim_dir: Path, on: bool) -> None:
    """Start (True) or end (False) a provider outage in which every delete raises DeleteUnconfirmed."""
    flag = sim_dir / "fail_deletes"
    if on:
        flag.touch()
    else:
        flag.unlink(missing_ok=True)


__all__ = [
    "Billing", "SimCloud", "SimGpu", "SimRecord", "SimRegion", "SimSettings",
    "SimStore", "billed_seconds", "billing", "preempt_machine", "set_fail_deletes", "sim_machines",
]
