"""The controller's own log: one file per run under the state folder,
`<state>/runs/<run>/controller.log`, rotated by loguru (at ROTATE_AT, keeping KEEP old files).

Every line names the job and the attempt it is about (`-` when none): actors bind them from their
label (actors/base.py), and `event_logger`'s Runner subscriber writes the run's lifecycle events
(what the ledger records, one line each, progress and meter beats left out) with them bound. The
CLI configures this (STYLE: loguru is configured once, by the caller); the Runner, a library,
leaves logging to its embedder. `actor-run runs` shows each run's file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actor_run.protocols.failures import Code
from actor_run.protocols.files import private_opener
from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    CacheOpened,
    Event,
    Exited,
    Fetched,
    JobEnded,
    JobStarted,
    Leased,
    LeaseFailed,
    LeaseRequested,
    LeaseStage,
    Metered,
    Progress,
    Released,
    Retrying,
    Stalled,
    TransferFailed,
    Uploaded,
    WaitingForCapacity,
)
from actor_run.protocols.redact import redact
from actor_run.protocols.specs import job_key

ROTATE_AT = "20 MB"
KEEP = 5
FORMAT = "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {extra[job]} {extra[attempt]} {message}\n{exception}"


def run_log_path(state_dir: Path | str, run: str) -> Path:
    return Path(state_dir) / "runs" / run / "controller.log"


def _format(record: Any) -> str:
    extra = record["extra"]
    extra.setdefault("job", "-")
    extra.setdefault("attempt", "-")
    record["message"] = redact(record["message"])  # no secret value this process knows (protocols/redact.py)
    return FORMAT


def open_run_log(state_dir: Path | str, run: str, level: str = "INFO") -> int:
    """Send the controller's log lines to the run's file from now on: those bound to this run (by
    `event_logger`) and those bound to none (a controller resuming two runs writes each run's lines
    to its own file); returns loguru's handler id (`logger.remove(id)` stops it). No variable
    values in tracebacks: a job's environment may hold a secret."""
    from loguru import logger  # loguru imports asyncio: `actor-run runs` (run_log_path) does without it

    path = run_log_path(state_dir, run)
    path.parent.mkdir(parents=True, exist_ok=True)

    def ours(record: Any) -> bool:
        return bool(record["extra"].get("run", run) == run)

    return logger.add(path, level=level, format=_format, filter=ours, rotation=ROTATE_AT, retention=KEEP,
                      backtrace=False, diagnose=False, encoding="utf-8", opener=private_opener)


def describe(e: Event) -> str | None:
    """One line for an event of an attempt's life (None for those the log leaves out)."""
    match e:
        case Progress() | Metered():
            return None
        case AttemptStarted(offer=o):
            place = " ".join(x for x in (o.cloud, o.region or o.host, o.gpu) if x)
            return f"attempt started: candidate {o.candidate} ({place}, ${o.hourly_usd:.2f}/h)"
        case LeaseRequested(name=name):
            return f"create requested: {name}"
        case LeaseStage(name=name, stage=stage):
            return f"{name}: {stage}"
        case CacheOpened(cache=cache, region=region, cold=True, detail=detail):
            return f"cache {cache} in {region or 'this place'}: {detail}"
        case CacheOpened(cache=cache, region=region, volume=volume, path=path, created=created):
            return f"cache {cache} ({volume}) {'made' if created else 'found'} in {region}, mounted at {path}"
        case WaitingForCapacity(budget=budget, until=until) if budget:
            return f"waiting for room in the team budget {budget!r} until {_clock(until)}"
        case WaitingForCapacity(wanted=wanted, until=until):
            return f"waiting for capacity ({wanted}) until {_clock(until)}"
        case Leased(machine=m):
            return f"leased {m.name} ({m.id}) at ${m.hourly_usd:.2f}/h"
        case LeaseFailed(failure=failure, detail=detail):
            return f"lease failed: {failure}: {detail}"
        case Uploaded(bytes_sent=sent, seconds=seconds):
            return f"uploaded {sent} bytes in {seconds:.2f} s"
        case TransferFailed(failure=failure, detail=detail):
            return f"transfer failed: {failure}: {detail}"
        case JobStarted(pid=pid):
            return f"job started (pid {pid})"
        case Exited(exit_code=code):
            return f"job exited {code}"
        case Stalled(failure=failure, detail=detail):
            return f"stopped watching: {failure}: {detail}"
        case Fetched(bytes_received=received, seconds=seconds):
            return f"fetched {received} bytes in {seconds:.2f} s"
        case Released(machine=name, confirmed=confirmed, detail=detail):
            return f"released {name}" + ("" if confirmed else f", deletion NOT confirmed: {detail}")
        case AttemptEnded(outcome=outcome, failure=failure, detail=detail, usage=u):
            why = f" {failure}: {detail}" if failure else ""
            return f"attempt ended {outcome}{why} (${u.usd:.4f}{' at least' if u.at_least else ''})"
        case Retrying(failure=failure, delay_s=delay, offer=o):
            return f"retrying after {failure} in {delay:.2f} s on candidate {o.candidate}"
        case JobEnded(outcome=outcome, failure=failure, detail=detail, attempts=n, usd=usd):
            why = f" {failure}: {detail}" if failure else ""
            return f"job ended {outcome}{why} after {n} attempt(s), ${usd:.4f}"
        case _:
            return type(e).__name__


def level_of(e: Event) -> str:
    """WARNING for what a user should act on: a job that ended failed (not one canceled on purpose),
    a machine whose deletion was not confirmed. Everything the batch rides out by itself (a place
    without stock, a launch that failed and was retried, a stall retried) is INFO: in the run's log,
    not on the terminal."""
    match e:
        case JobEnded(outcome=outcome, failure=failure):
            return "WARNING" if outcome != "succeeded" and failure is not Code.CANCELED else "INFO"
        case Released(confirmed=confirmed):
            return "INFO" if confirmed else "WARNING"
        case _:
            return "INFO"


def event_logger(run_of: Callable[[str], str]) -> Callable[[Event], None]:
    """A Runner subscriber (`runner.subscribe(event_logger(runner.run_of))`): each event as one line
    (what a user should act on as a WARNING: `level_of`) with its job, attempt and run bound."""
    from loguru import logger

    def log_event(e: Event) -> None:
        text = describe(e)
        if text is not None:
            key = job_key(e.job, e.seed)
            logger.bind(job=key, attempt=f"a{e.attempt}", run=run_of(key)).log(level_of(e), text)

    return log_event


def _clock(t: float) -> str:
    """A unix time as this computer's wall clock (HH:MM:SS)."""
    return time.strftime("%H:%M:%S", time.localtime(t))
