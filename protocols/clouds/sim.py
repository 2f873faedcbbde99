"""The `sim` cloud: a simulated GPU provider for dry runs, demos, chaos tests and load tests.

Settings (`[clouds.sim]`), every field optional; a rate is a probability per launch::

    state_dir = ""              # default: <actor-run state>/sim
    seed = 7                    # set: each machine's fate is a function of (seed, name); unset: random
    no_capacity_rate = 0.0      # the launch is refused cleanly: `no_capacity`, no machine
    launch_failure_rate = 0.0   # the launch is refused cleanly: `launch_failed`, no machine
    ambiguous_rate = 0.0        # the machine is made, then the launch raises `LaunchAmbiguous`
    boot_failure_rate = 0.0     # the launch returns a machine that never answers: `connect` raises
                                # `Unreachable` (it holds stock and bills until deleted; never preempted)
    preempt_rate = 0.0          # the machine is preempted at a random moment within preempt_within_s
    preempt_within_s = 30.0
    launch_latency_s = 0.2
    delete_latency_s = 0.05
    virtual = false             # machines only pretend to run (clouds/virtual.py); else local sandboxes
    virtual_job_s = 1.0         # how long a virtual job runs
    virtual_exit_code = 0
    api_key_env = ""            # set: the variable must be set (an account's key; its value is never read)
    quota_exceeded = false      # every launch is refused: the account is out of quota or balance (`quota`)
    preempt_attempts = 0        # each job's first N attempts: machines preempted preempt_within_s after launch
    oom_below_gb = 0.0          # a virtual job on a GPU with less memory than this (clouds/gpus.py) is killed by
                                # the "kernel's OOM killer" at its end: exit 137 and the OOM killer's line in its log
    retriable_attempts = 0      # each job's first N attempts (virtual): the job flags `{"retriable": true, "reason":
                                # ...}` and exits 1 (a sandbox job gives its own verdict; it sees $ACTOR_RUN_GPU)

    [clouds.sim.accounts.team-b]  # another account at the same provider: these settings over the above
    api_key_env = "SIM_TEAM_B_KEY"

    [[clouds.sim.regions]]      # default: us-east, eu-west, ap-south with A100s and H100s
    name = "us-east"
    gpus = { A100 = { stock = 8, hourly_usd = 1.8 }, H100 = { stock = 4, hourly_usd = 2.9 } }

State lives in the sim's folder, not in the process, so a killed controller leaves its machines
behind exactly as at a real provider, and two controllers share one sim cloud::

    lock                  flock'ed around every change (threads and processes)
    machines/<name>.json  one per machine the provider holds: the Machine fields, `state`
                          (running | preempted), `preempt_at`, `virtual`, `broken`
    held.json             machines held per "region/gpu": stock left is stock - held
    changes               how many times an existing record was replaced or removed (8 bytes): the
                          machines' guards look at their records again only when it moved
    billing.jsonl         one line per deleted machine (`Billing`), naming the account it bills
    sandboxes/<name>/     a real machine's root (mode 0700), as in the local cloud
    fail_deletes          while this file exists every delete raises `DeleteUnconfirmed`

A machine holds stock from its launch to its deletion, preempted or not. Preemption is noticed by
the next call to the machine (a host call, a virtual workspace call): its processes are stopped,
its state becomes `preempted` and the call raises `MachineGone`; until deleted it is still listed.
Billing runs from the launch to the delete request (the one that worked), or to the preemption if
that came first, per machine and per second (of float time: the bill is as fine as the clock), to
the machine's account. Accounts share the provider's stock and folder; each lists only its own
machines. `seed` makes fates independent of the order of launches: a retry has a new name, hence a new fate. A
machine's deadline is recorded, not enforced (no self-destruct): a sweep finds it past its deadline.
`list_ours` also counts held.json again from the machine files (a crash between the two writes).

Chaos helpers for tests and benches (synchronous, on the sim's folder `SimCloud.dir`):
`preempt_machine` preempts one machine now, `set_fail_deletes` switches the provider outage on or
off, `sim_machines` names the machines held, `billed_seconds` totals billing.jsonl. The folder's
code (`SimStore` and these helpers) is in protocols/clouds/simstore.py.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from pathlib import Path

import msgspec
import trio

from actor_run.protocols.clouds.coalesce import Coalescer
from actor_run.protocols.clouds.gpus import gpu_memory_gb, gpu_names
from actor_run.protocols.clouds.simstore import (
    SAFE_NAME,
    Billing,
    Fate,
    SimRecord,
    SimStore,
    StatKey,
    billed_seconds,
    billing,
    place_key,
    preempt_machine,
    set_fail_deletes,
    sim_machines,
)
from actor_run.protocols.clouds.virtual import MachineGuard, SimHost, VirtualMachine, VirtualWorkspace, write_files
from actor_run.protocols.failures import (
    Code,
    LaunchAmbiguous,
    LaunchError,
    LaunchRefused,
    MachineGone,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts.workspace import ShellWorkspace, Workspace
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import parse_name
from actor_run.protocols.specs import CandidateSpec

_ids = random.Random()  # machine ids: seeded once from the OS; uuid4 made a system call per launch
_RATES = ("no_capacity_rate", "launch_failure_rate", "ambiguous_rate", "boot_failure_rate", "preempt_rate")
_DURATIONS = ("preempt_within_s", "launch_latency_s", "delete_latency_s", "virtual_job_s")


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
    api_key_env: str = ""
    quota_exceeded: bool = False
    preempt_attempts: int = 0
    oom_below_gb: float = 0.0
    retriable_attempts: int = 0

    def __post_init__(self) -> None:
        for field in _RATES:
            value = getattr(self, field)
            if not 0.0 <= value <= 1.0:
                raise SpecError(f"clouds.sim.{field}", f"expected number between 0 and 1, got {value}")
        for field in (*_DURATIONS, "preempt_attempts", "oom_below_gb", "retriable_attempts"):
            value = getattr(self, field)
            if value < 0:
                raise SpecError(f"clouds.sim.{field}", f"expected number >= 0, got {value}")


def _machine(rec: SimRecord, now: float | None = None) -> Machine:
    """The Machine a caller sees; with `now` (a listing), preempted ones say when they were taken."""
    m = Machine(**{f: getattr(rec, f) for f in Machine.__struct_fields__})
    if now is not None and rec.preempt_at is not None and (rec.state == "preempted" or rec.preempt_at <= now):
        m = msgspec.structs.replace(m, taken_at=min(rec.preempt_at, now))
    return m


class SimCloud:
    """The simulated provider (see the module docstring); its state is in `self.dir`."""

    name = "sim"
    account = ""  # make_cloud sets it for an account of [clouds.sim.accounts]

    def __init__(self, settings: SimSettings, state_dir: Path) -> None:
        if settings.api_key_env and not os.environ.get(settings.api_key_env):
            raise SpecError("clouds.sim.api_key_env", f"set the environment variable {settings.api_key_env}")
        self.settings = settings
        own = Path(settings.state_dir).expanduser() if settings.state_dir else state_dir / "sim"
        self.dir = own.resolve()
        self._store = SimStore(self.dir)
        self._rng = random.Random(settings.seed)
        self._places = {
            place_key(r.name, g): (r.name, g, spec) for r in settings.regions for g, spec in r.gpus.items()
        }
        self._virtual: dict[str, VirtualMachine] = {}
        self._sizes: dict[str, int] = {}  # digest -> bytes, for virtual publishing
        # creates and deletes that come while one batch is in the store go together in the next; a
        # machine is made `launch_latency_s` after it was asked for: one timer per batch, not a trio
        # sleep per launch (a cancel scope, a deadline and its expiry each: bench/RESULTS.md, item 56)
        self._creates = Coalescer(self._store.create_many, delay_s=settings.launch_latency_s)
        # a delete is confirmed `delete_latency_s` after it was asked for: one timer per batch
        self._deletes = Coalescer(self._store.delete_many, delay_s=settings.delete_latency_s)
        self._fetch_writes = Coalescer(write_files)  # what virtual machines' fetches write locally
        self._fresh: dict[str, tuple[SimRecord, StatKey]] = {}  # made by launch, not yet connected

    def _fate(self, name: str) -> Fate:
        s = self.settings
        # crc32 rather than the string itself: seeding from a str hashes it with sha512 (3 % of a
        # thousand launches)
        rng = random.Random(zlib.crc32(f"{s.seed}/{name}".encode())) if s.seed is not None else self._rng
        u = [rng.random() for _ in range(6)]
        parsed = parse_name(name) if s.preempt_attempts else None
        if parsed is not None and parsed.attempt < s.preempt_attempts:
            u[4], u[5] = -1.0, 1.0  # preempted, whatever the rate, preempt_within_s after its launch
        return Fate(
            no_capacity=u[0] < s.no_capacity_rate, failed=u[1] < s.launch_failure_rate,
            ambiguous=u[2] < s.ambiguous_rate, broken=u[3] < s.boot_failure_rate,
            # a machine that never came up is never preempted: nothing would tell its controller when
            # its bill stopped (a broken machine is billed until it is deleted)
            preempt_in=u[5] * s.preempt_within_s if u[4] < s.preempt_rate and not u[3] < s.boot_failure_rate else None,
        )

    @property
    def gpu_names(self) -> frozenset[str]:
        """What a candidate's `gpu` may say here: the GPU table's names and the regions' own."""
        return gpu_names() | {g for r in self.settings.regions for g in r.gpus}

    @property
    def region_names(self) -> frozenset[str]:
        """The regions `[[clouds.sim.regions]]` configures."""
        return frozenset(r.name for r in self.settings.regions)

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
            left = spec.stock - held.get(key, 0)
            if left <= 0:
                continue
            if candidate.max_hourly_usd is not None and spec.hourly_usd > candidate.max_hourly_usd:
                continue
            out.append(
                Offer(cloud=self.name, region=region, gpu=gpu, hourly_usd=spec.hourly_usd, candidate=index,
                      stock=str(left))
            )
        out.sort(key=lambda o: (o.hourly_usd, o.region, o.gpu))
        return out

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        place = self._places.get(place_key(offer.region, offer.gpu))
        if place is None:
            raise LaunchRefused(f"sim: no {offer.gpu!r} in region {offer.region!r}", code=Code.NO_CAPACITY)
        if not SAFE_NAME.fullmatch(name):
            raise LaunchRefused(f"sim: {name!r} is not a valid machine name", code=Code.LAUNCH_FAILED)
        region, gpu, spec = place
        if self.settings.quota_exceeded:
            raise LaunchRefused(f"sim: account {self.account or 'main'} is out of quota (injected)", code=Code.QUOTA)
        fate = self._fate(name)
        now = time.time() + self.settings.launch_latency_s  # made then: the batch's timer holds the create till then
        virtual = self.settings.virtual
        rec = SimRecord(
            cloud=self.name, id=f"sim-{_ids.getrandbits(64):016x}", name=name, region=region, gpu=gpu,
            hourly_usd=spec.hourly_usd, deadline=deadline, created_at=now, address="localhost",
            root=f"/sim-virtual/{name}" if virtual else str(self._store.sandboxes / name),
            preempt_at=None if fate.preempt_in is None else now + fate.preempt_in,
            virtual=virtual, broken=fate.broken, account=self.account,
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
            memory = gpu_memory_gb(rec.gpu)
            oom = memory is not None and memory < self.settings.oom_below_gb
            ws = VirtualWorkspace(rec.name, vm, guard, self.settings.virtual_job_s,
                                  self.settings.virtual_exit_code, self._sizes, self._fetch_writes,
                                  oom=f"sim: {rec.gpu} has {memory:g} GB" if oom else "",
                                  retriable_attempts=self.settings.retriable_attempts)
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
        asked = time.time()  # the bill stops at the request; the latency is the wait for its confirmation
        # after delete_latency_s (the batch's delay); raises the DeleteUnconfirmed delete_many answered
        await self._deletes((name, asked))
        self._virtual.pop(name, None)
        self._fresh.pop(name, None)

    async def list_ours(self, prefix: str) -> list[Machine]:
        listed = await trio.to_thread.run_sync(self._store.listing, prefix)
        now = time.time()
        return [_machine(r, now) for r in listed if r.account == self.account]  # an account sees its own

    async def aclose(self) -> None:
        self._store.close()


__all__ = [
    "Billing", "SimCloud", "SimGpu", "SimRecord", "SimRegion", "SimSettings",
    "SimStore", "billed_seconds", "billing", "preempt_machine", "set_fail_deletes", "sim_machines",
]
