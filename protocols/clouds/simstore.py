"""The sim cloud's folder (protocols/clouds/sim.py has the layout): synchronous file work that a
controller, a sweep in another process and the test helpers share. `SimStore` changes it under
`lock` (an flock, so threads and processes take turns); the helpers at the end are for tests and
benches."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from actor_run.protocols.clouds.local import remove_tree, stop_processes_under
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchError, LaunchRefused
from actor_run.protocols.messages import Machine

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


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
    account: str = ""


class Fate(msgspec.Struct, frozen=True, kw_only=True):
    no_capacity: bool
    failed: bool
    ambiguous: bool
    broken: bool
    preempt_in: float | None


_record_decoder = msgspec.json.Decoder(SimRecord)
_billing_decoder = msgspec.json.Decoder(Billing)
_held_decoder = msgspec.json.Decoder(dict[str, int])
_tmp_ids = itertools.count()  # with the pid, names a record being written (uuid4 is a system call)


FOLDER_LOOK_S = 0.05  # guards share one look at the folder's change count for this long
StatKey = tuple[int, int, int]  # (inode, mtime_ns, size) of a record file
_COUNT = 8  # bytes of the `changes` file: a little-endian count


class _FolderLook:
    """One process's last look at a sim folder's count of changes to existing records
    (SimStore.changes), and the changes this process made itself: how many, and which record each
    last changed (its number among them), so a guard tells this process's deletes of other machines
    from a change to its own without a look at its record."""

    __slots__ = ("_count", "epoch", "looked", "marks", "own", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.looked = -FOLDER_LOOK_S  # time.monotonic() of the last look
        self._count = 0
        self.own = 0  # changes made through this process's stores
        self.marks: dict[str, int] = {}  # record name -> `own` after this process last changed it
        self.epoch = 0  # moves when `marks` is let go of (every guard looks at its record once then)

    def count(self) -> int:
        now = time.monotonic()
        if now - self.looked >= FOLDER_LOOK_S:
            self.looked = now
            self._count = _read_count(self.path)
        return self._count

    def moved(self, names: list[str]) -> None:
        """This process changed the records `names` (one change to the count): the next count is a
        fresh look. `marks` holds at most MARKS names: then it starts again, with a new `epoch`."""
        self.own += 1
        if len(self.marks) + len(names) > MARKS:
            self.marks = {}
            self.epoch += 1
        for name in names:
            self.marks[name] = self.own
        self.looked = -FOLDER_LOOK_S


MARKS = 4096  # names of records this process changed, kept for its guards (then let go of, all at once)


def _read_count(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        return int.from_bytes(os.pread(fd, _COUNT, 0), "little")
    finally:
        os.close(fd)


_LOOKS: dict[str, _FolderLook] = {}  # by `changes` file: shared by the stores of this process


def place_key(region: str, gpu: str) -> str:
    return f"{region}/{gpu.lower()}"


def _bill(rec: SimRecord, now: float) -> Billing:
    end = now if rec.preempt_at is None else min(now, rec.preempt_at)
    seconds = max(0.0, end - rec.created_at)
    return Billing(
        name=rec.name, id=rec.id, region=rec.region, gpu=rec.gpu, created_at=rec.created_at,
        deleted_at=now, seconds=seconds, usd=seconds * rec.hourly_usd / 3600, preempted=end < now,
        account=rec.account,
    )


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
        changes = os.fspath(root / "changes")
        self._look = _LOOKS.setdefault(changes, _FolderLook(changes))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._mutex:
            if self._lock_fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                self._lock_fd = os.open(self.root / "lock", flags, 0o600)
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

    def changes(self, name: str) -> tuple[int, int, int]:
        """A stamp that moves whenever the record `name` may have changed: (the changes to existing
        records made by other processes, this process's `epoch`, the number of this process's last
        change to `name`). The changes are counted in the `changes` file, bumped under the lock by
        each preemption (a record replaced) or delete (removed), by any process; a create adds a
        record and changes none, so a burst of launches leaves it as it is (the folder's mtime, what
        guards compared before, moved with every create). This process's own changes say which
        records they touched, so an end burst's deletes move the stamp of the machines deleted only
        (while any delete moved the count, every guard `stat`ed its record at every poll of the
        burst). One look at the count serves every store of this process for `FOLDER_LOOK_S`; a
        change made through any of them is seen at the next call, one made by another process
        within `FOLDER_LOOK_S` (a look that crosses a bump of this process's may move the stamp for
        nothing: a `stat` more, never a change missed for longer). A count, not a time: no clock
        tick can hide a change. On the reactor thread."""
        look = self._look
        return look.count() - look.own, look.epoch, look.marks.get(name, 0)

    def _bump(self, names: list[str]) -> None:
        """Under the lock: one more change, to the existing records `names` (`changes`)."""
        fd = os.open(self.root / "changes", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            count = int.from_bytes(os.pread(fd, _COUNT, 0), "little")
            os.pwrite(fd, (count + 1).to_bytes(_COUNT, "little"), 0)
        finally:
            os.close(fd)
        self._look.moved(names)

    def read(self, name: str) -> SimRecord | None:
        if not SAFE_NAME.fullmatch(name):
            return None
        try:
            return _record_decoder.decode(self.path(name).read_bytes())
        except FileNotFoundError:
            return None

    def _read_raw(self, name: str) -> SimRecord | None:
        """`read` in three system calls (open, read, close) where a file object takes five or six:
        a thousand deletes in one batch, each call a moment the GIL is let go (a name already
        checked against SAFE_NAME)."""
        try:
            fd = os.open(self.path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            data = os.read(fd, 1 << 16)
            while len(data) % (1 << 16) == 0 and data:  # a record is a few hundred bytes; any size is read whole
                more = os.read(fd, 1 << 16)
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
        return _record_decoder.decode(data)

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
            held[place_key(rec.region, rec.gpu)] = held.get(place_key(rec.region, rec.gpu), 0) + 1
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

    def create_many(self, items: list[tuple[SimRecord, int, Fate]]) -> list[LaunchError | StatKey]:
        """Make each machine (answering its record file's stat key), or answer the provider's
        refusal (which proves no machine was made); all under one lock. Stock is counted
        (held.json) before the records appear: a crash between over-counts, which `listing`
        repairs."""
        # the records are written before taking the lock: creating a file is the slow part
        tmps = []
        for rec, _, _ in items:
            tmp = self.machines / f".{rec.name}.{os.getpid()}.{next(_tmp_ids)}.tmp"
            tmp.write_bytes(msgspec.json.encode(rec))
            tmps.append(tmp)
        placed: set[Path] = set()
        out: list[LaunchError | StatKey] = []
        try:
            with self.locked():
                held, made = self._held_locked(), set[str]()
                refusals = [self._admit(rec, stock, fate, held, made) for rec, stock, fate in items]
                if made:
                    self._save_held(held)
                for (rec, _, _), tmp, refusal in zip(items, tmps, refusals, strict=True):
                    if refusal is not None:
                        out.append(refusal)
                        continue
                    path = self.path(rec.name)
                    os.replace(tmp, path)
                    placed.add(tmp)
                    st = os.stat(path)
                    out.append((st.st_ino, st.st_mtime_ns, st.st_size))
                    if not rec.virtual:
                        (self.sandboxes / rec.name).mkdir(parents=True, mode=0o700)
        finally:
            for tmp in tmps:
                if tmp not in placed:  # the others were renamed into place
                    tmp.unlink(missing_ok=True)
        return out

    def _admit(self, rec: SimRecord, stock: int, fate: Fate, held: dict[str, int],
               made: set[str]) -> LaunchError | None:
        if rec.name in made or self.path(rec.name).exists():
            return LaunchAmbiguous(f"sim: a machine named {rec.name} exists already")
        place = place_key(rec.region, rec.gpu)
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
        bills: list[bytes] = []
        with self.locked():
            held, changed = self._held_locked(), []
            for name, now in items:
                if not SAFE_NAME.fullmatch(name):
                    out.append(None)  # no machine can have this name
                    continue
                rec = self._read_raw(name)
                # a virtual machine has no sandbox: its record is all there is (a stat or three
                # fewer per machine; each lets go of the GIL, and a thousand deletes come at once)
                sandbox = None if rec is not None and rec.virtual else self.sandboxes / name
                if sandbox is not None and sandbox.exists():
                    try:
                        stop_processes_under(sandbox)
                    except DeleteUnconfirmed as exc:  # a process outlived SIGKILL: try again later
                        out.append(exc)
                        continue
                if rec is not None:
                    self.path(name).unlink()  # under the lock: gone once this returns
                    place = place_key(rec.region, rec.gpu)
                    held[place] = held.get(place, 0) - 1
                    changed.append(name)
                    bills.append(msgspec.json.encode(_bill(rec, now)) + b"\n")
                if sandbox is not None and sandbox.exists():
                    # after the record: a call that passed its guard before may still write here
                    with contextlib.suppress(OSError):  # then what it wrote is left: "still there", retried
                        remove_tree(sandbox)
                left = sandbox is not None and sandbox.exists()
                out.append(DeleteUnconfirmed(f"sim: {name} is still there") if left else None)
            if bills:  # one write for the batch, before the lock is let go (a line per machine cost a system call each)
                with open(self.root / "billing.jsonl", "ab", buffering=0) as f:
                    f.write(b"".join(bills))
            if changed:
                self._save_held(held)
                self._bump(changed)  # after the unlinks: a guard that looked before them looks again
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
                self._bump([name])
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
    "SAFE_NAME", "Billing", "Fate", "SimRecord", "SimStore", "StatKey", "billed_seconds", "billing", "place_key",
    "preempt_machine", "set_fail_deletes", "sim_machines",
]
