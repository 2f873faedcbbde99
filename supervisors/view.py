"""What the CLI shows: a live line per job (state, attempt, place, elapsed, cost) and a summary
table at the end; or, with --json, one event per line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import msgspec
from rich.console import Console
from rich.live import Live
from rich.table import Table

from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    Event,
    Exited,
    Fetched,
    JobEnded,
    JobStarted,
    Leased,
    LeaseFailed,
    LeaseRequested,
    Metered,
    Progress,
    Released,
    Retrying,
    Stalled,
    TransferFailed,
    Uploaded,
    encode,
)
from actor_run.protocols.specs import job_key


class JobLine(msgspec.Struct, kw_only=True):
    key: str
    state: str = "pending"
    attempt: int = 0
    place: str = ""
    started: float = 0.0
    ended: float | None = None
    usd: float = 0.0
    usd_done: float = 0.0
    failure: str = ""
    detail: str = ""
    stage: str = ""


_STATES: dict[type, str] = {
    AttemptStarted: "leasing", LeaseRequested: "leasing", Leased: "uploading", Uploaded: "starting",
    JobStarted: "running", Exited: "fetching", Fetched: "fetched", Stalled: "stopping", Retrying: "retrying",
    LeaseFailed: "lease failed", TransferFailed: "stopping", Released: "released",
}


class View:
    def __init__(self, keys: list[str], *, json_mode: bool, out: TextIO | None = None,
                 run_of: Callable[[str], str] | None = None) -> None:
        self.json_mode = json_mode
        self.run_of = run_of  # job key -> its run: every --json line carries `"run": ...`
        self.out = out or sys.stdout
        self.lines = {k: JobLine(key=k) for k in keys}
        self.console = Console(file=self.out, highlight=False, width=None if self.out.isatty() else 140)
        self.live: Live | None = None
        self.tty = self.out.isatty()

    def __enter__(self) -> View:
        if not self.json_mode and self.tty:
            self.live = Live(self._table(final=False), console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def event(self, e: Event) -> None:
        key = job_key(e.job, e.seed)
        if self.json_mode:
            body = encode(e).decode()
            if self.run_of is not None:  # an event is a JSON object: the run goes first
                body = '{"run":' + msgspec.json.encode(self.run_of(key)).decode() + "," + body[1:]
            self.out.write(body + "\n")
            self.out.flush()
        line = self.lines.get(key)
        if line is None:
            return
        before = line.state
        if line.started == 0.0:
            line.started = e.t
        match e:
            case AttemptStarted(offer=o):
                line.attempt = e.attempt
                line.place = " ".join(x for x in (o.cloud, o.region or o.host, o.gpu) if x)
            case Progress(stage=stage):
                line.stage = stage
            case Metered(usd=usd):
                line.usd = line.usd_done + usd
            case AttemptEnded(usage=u):
                line.usd_done += u.usd
                line.usd = line.usd_done
            case JobEnded(outcome=outcome, failure=failure, detail=detail, usd=usd):
                line.state = outcome
                line.failure = str(failure) if failure else ""
                line.detail = detail
                line.ended = e.t
                line.usd = usd
            case _:
                pass
        if type(e) in _STATES and line.state not in ("succeeded", "failed"):
            line.state = _STATES[type(e)]
        if self.live is not None:
            self.live.update(self._table(final=False))
        elif not self.json_mode and line.state != before:
            self.console.print(self._plain(line))

    def _plain(self, line: JobLine) -> str:
        tail = f" {line.failure}: {line.detail}" if line.failure else ""
        return (f"{line.key:<28} {line.state:<11} attempt {line.attempt} {line.place:<24} "
                f"{self._elapsed(line):>7} ${line.usd:.4f}{tail}")

    @staticmethod
    def _elapsed(line: JobLine) -> str:
        if not line.started:
            return "-"
        end = line.ended or time.time()
        return f"{end - line.started:.1f}s"

    def _table(self, *, final: bool) -> Table:
        t = Table(title="actor-run" if not final else "summary", expand=False)
        for col in ("job", "state", "attempt", "place", "stage" if not final else "failure", "elapsed", "cost"):
            t.add_column(col)
        for line in self.lines.values():
            fifth = line.stage if not final else (f"{line.failure}: {line.detail}"[:60] if line.failure else "")
            t.add_row(line.key, line.state, str(line.attempt), line.place, fifth, self._elapsed(line),
                      f"${line.usd:.4f}")
        return t

    def summary(self) -> None:
        if self.json_mode:
            return
        self.console.print(self._table(final=True))
