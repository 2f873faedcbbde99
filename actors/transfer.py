"""TransferActor: code and inputs up (by content hash, once per host), outputs down.

`Upload(machine)` snapshots and hashes the code folder, hashes each input (cached by path, size,
mtime and inode), publishes what the host lacks and answers `Uploaded(code, inputs)`; `Fetch`
brings `out/` and `progress.jsonl` back into a folder (replacing the ones there), never through a
link, and answers `Fetched`. A refusal answers `TransferFailed(input|guard)`; a host unreachable
for `lost_after_s` answers `TransferFailed(unreachable)`. Hashing runs in a worker thread, never
on the reactor's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import outcome
import pykka
import trio

from actor_run.actors.base import Actor, Context
from actor_run.actors.durable import IntentNotRecorded, wait_durable
from actor_run.actors.runtime import Result
from actor_run.protocols.failures import Code, MachineGone, Refused, Unreachable
from actor_run.protocols.hosts.content import input_sha256, snapshot_code
from actor_run.protocols.hosts.workspace import RESUME_LINE, Workspace
from actor_run.protocols.messages import (
    AttemptHead,
    CheckpointSaved,
    Fetch,
    FetchCheckpoint,
    Fetched,
    InputRef,
    Message,
    TransferFailed,
    Upload,
    Uploaded,
)
from actor_run.protocols.offload import to_thread
from actor_run.protocols.specs import Job


class _Done(Message, frozen=True, kw_only=True):
    kind: str  # upload | fetch | checkpoint
    result: Any
    started: float
    path: str = ""
    line: dict[str, Any] = msgspec.field(default_factory=dict)


def _done(kind: str, started: float, result: Result[Any], *, path: str = "",
          line: dict[str, Any] | None = None) -> _Done:
    """A transfer task's end, as the actor hears it."""
    return _Done(kind=kind, result=result, started=started, path=path, line=line or {})


def _hash_input(ctx: Context, path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    with ctx.hash_lock:
        known = ctx.hash_cache.get(key)
    if known is not None and path.is_file():
        return known
    digest = input_sha256(path)
    with ctx.hash_lock:
        ctx.hash_cache[key] = digest
    return digest


async def patiently(what: str, lost_after_s: float, step: Any, *args: Any) -> Any:
    """Repeat a step while the host cannot be reached, up to lost_after_s in all."""
    since: float | None = None
    while True:
        try:
            return await step(*args)
        except Unreachable:
            now = trio.current_time()
            since = now if since is None else since
            if now - since > lost_after_s:
                raise
            await trio.sleep(min(2.0, max(0.1, lost_after_s / 10)))


def _remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def _settle_checkpoint(fresh: Path, into: Path, line: dict[str, Any]) -> None:
    """fresh/fetched/out/<files> -> into/<files> + into/progress.json, replacing the old one whole."""
    staged = fresh / "ready"
    staged.mkdir(parents=True)
    out = fresh / "fetched" / "out"
    if out.is_dir():
        for child in out.iterdir():
            child.rename(staged / child.name)
    (staged / RESUME_LINE).write_text(json.dumps(line) + "\n")
    old = into.with_name(into.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if into.exists():
        into.rename(old)
    staged.rename(into)
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


class TransferActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: Job, attempt: int) -> None:
        super().__init__(ctx, parent, f"transfer:{job.name}/{job.seed}/a{attempt}")
        self.job, self.attempt = job, attempt

    @functools.cached_property
    def tag(self) -> str:
        """What names this transfer's staging on the host (made when something is published: a
        `getpid` is a system call, and most attempts of a batch publish nothing new)."""
        return f"{self.job.name}-{self.job.seed}-a{self.attempt}-{os.getpid()}-{self.ctx.owner[:8]}"

    def handle(self, message: Any) -> Any:
        match message:
            case Upload(machine=machine, resume_dir=resume_dir):
                ws, started = self.ctx.workspaces[machine], time.time()
                if self.job.code is None and not self.job.inputs and resume_dir is None:
                    # nothing to send: the answer is known here, without a reactor task (item 58)
                    self.tell_parent(self._answer("upload", started, outcome.Value((0, None, [], None))))
                    return None
                self._spawn_for_parent(self._upload, ws, resume_dir, kind="upload", started=started)
            case FetchCheckpoint(machine=machine, work=work, path=path, line=line, into=into):
                held, started = self.ctx.workspaces.get(machine), time.time()
                if held is not None:
                    self.spawn(self._checkpoint, held, work, path, line, Path(into),
                               reply=functools.partial(_done, "checkpoint", started, path=path, line=line))
            case Fetch(machine=machine, work=work, into=into, replace=replace):
                ws, started = self.ctx.workspaces[machine], time.time()
                self._spawn_for_parent(self._fetch, ws, work, Path(into), replace, kind="fetch", started=started)
            case _Done(kind="checkpoint", result=result, path=path, line=line):
                self._checkpoint_done(result, path, line)
            case _:
                raise TypeError(f"TransferActor cannot handle {message!r}")

    async def _upload(
        self, ws: Workspace, resume_dir: str | None,
    ) -> tuple[int, str | None, list[InputRef], InputRef | None]:
        lost = self.job.policy.lost_after_s
        sent = 0
        code_hash: str | None = None
        if self.job.code is not None:
            with tempfile.TemporaryDirectory(prefix="actor-run-code-") as tmp:
                snap = Path(tmp) / "code"
                code_hash = await to_thread(snapshot_code, Path(self.job.code), snap)
                sent += await patiently("code", lost, ws.publish_code, snap, code_hash, self.tag)
        refs = []
        for name, path_s in sorted(self.job.inputs.items()):
            path = Path(path_s)
            try:
                digest = await to_thread(_hash_input, self.ctx, path)
            except OSError as exc:
                raise Refused(Code.INPUT, f"input {name}: cannot read {path}: {exc.strerror}") from exc
            sent += await patiently(name, lost, ws.publish_input, name, path, digest, self.tag)
            refs.append(InputRef(name=name, sha256=digest, basename=path.name))
        resume = None
        if resume_dir is not None and Path(resume_dir).is_dir():  # noqa: ASYNC240 - one stat: a thread hop costs more
            digest = await to_thread(_hash_input, self.ctx, Path(resume_dir))
            sent += await patiently("resume", lost, ws.publish_input, "resume", Path(resume_dir), digest, self.tag)
            resume = InputRef(name="resume", sha256=digest, basename="")
        return sent, code_hash, refs, resume

    async def _fetch(self, ws: Workspace, work: str, into: Path, replace: bool) -> int:
        """Into the seed's folder itself: no staging folder made, moved and removed per attempt (on
        some disks a file or folder made costs half a millisecond: bench/RESULTS.md). `replace`: an
        earlier fetch may have been there (two system calls on the reactor, skipped for a clean folder)."""
        await self._check_claim()
        stale = [p for p in (into / "out", into / "progress.jsonl") if p.exists()] if replace else []
        if stale:  # a run or attempt before this one fetched: what comes now replaces it whole
            await to_thread(_remove, stale)
        n: int = await patiently("outputs", self.job.policy.lost_after_s, ws.fetch, work, into)
        return n

    async def _check_claim(self) -> None:
        """On a shared ledger, prove the claim on the job before its outputs are written here: a
        controller that lost the job (its lease ran out while it was frozen) fetches nothing."""
        key = self.job.key
        pending = self.ctx.ledger.check_job(key)
        if pending is not None:
            with contextlib.suppress(IntentNotRecorded):  # refused as stale: may_write says so
                await wait_durable(pending, self.ctx.reactor.soon, "the job's claim")
        if not self.ctx.ledger.may_write(key):
            raise Refused(Code.CANCELED, "this controller no longer holds the job: its outputs are the adopter's")

    async def _checkpoint(self, ws: Workspace, work: str, path: str, line: dict[str, Any], into: Path) -> int:
        """Fetch the files a progress line named into a fresh folder, then swap it in whole."""
        fresh = into.with_name(into.name + ".incoming")
        if fresh.exists():
            await to_thread(shutil.rmtree, fresh)
        got = await ws.fetch(work, fresh / "fetched", [path])
        await to_thread(_settle_checkpoint, fresh, into, line)
        return got

    def _checkpoint_done(self, result: Result[int], path: str, line: dict[str, Any]) -> None:
        if isinstance(result, outcome.Value):
            event = CheckpointSaved(job=self.job.name, seed=self.job.seed, attempt=self.attempt, path=path,
                                    line=line, bytes_received=result.value)
            self.ctx.emit(event)
        else:
            self.log.warning("checkpoint {} not fetched: {}", path, result.error)

    def _spawn_for_parent(self, fn: Any, *args: Any, kind: str, started: float) -> None:
        """An upload or a fetch on the reactor, whose answer (`Uploaded`, `Fetched` or `TransferFailed`)
        goes from the reactor straight to the parent while this actor lives: it is this actor's to
        say, but needs nothing of its state, so no turn of this actor passes it on (one per attempt
        at each end of a burst)."""
        parent = self.parent
        if parent is None:
            self.spawn(fn, *args, reply=_no_answer)
            return
        self.spawn(fn, *args, reply=functools.partial(self._answer, kind, started), to=parent)

    def _answer(self, kind: str, started: float, result: Result[Any]) -> Message:
        """What the parent hears of an upload's or a fetch's end (on the reactor thread: it reads only
        what never changes here, the job and the attempt)."""
        seconds = time.time() - started
        head: AttemptHead = {"job": self.job.name, "seed": self.job.seed, "attempt": self.attempt}
        if isinstance(result, outcome.Value):
            if kind == "upload":
                sent, code, refs, resume = result.value
                return Uploaded(**head, bytes_sent=sent, seconds=seconds, code=code, inputs=refs, resume=resume)
            return Fetched(**head, bytes_received=result.value, seconds=seconds)
        exc = result.error
        taken_at = None
        match exc:
            case Refused(code=code):
                failure, detail = code, str(exc)
            case MachineGone(at=at):
                failure, detail, taken_at = Code.PREEMPTED, str(exc), at
            case Unreachable():
                failure, detail = Code.UNREACHABLE, str(exc)
            case OSError():
                failure, detail = Code.INTERNAL, f"{kind}: {exc}"
            case _:
                failure, detail = Code.INTERNAL, f"{kind}: {type(exc).__name__}: {exc}"
        return TransferFailed(**head, failure=failure, detail=detail, taken_at=taken_at)


def _no_answer(_result: Result[Any]) -> None:
    return None
