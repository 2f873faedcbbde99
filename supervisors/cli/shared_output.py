"""What the commands of a shared ledger print of their jobs' events (worker.py): a worker's lines
for the jobs it runs (`printer`), and `actor-run run`'s for its batch, whoever runs each job
(`RunOutput`, which reads the other workers' from the ledger). With `--json` each line is an event
naming its run (protocols/messages.py `run_line`); otherwise a line per job that ended."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from actor_run.protocols.messages import Event, JobEnded, decode_event, encode, run_line
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger import LedgerReader

if TYPE_CHECKING:
    from actor_run.supervisors.api.runner import Runner


def _ended_line(e: JobEnded) -> str:
    tail = f" {e.failure}: {e.detail}" if e.failure else ""
    return f"{e.job}/seed-{e.seed:<6} {e.outcome:<10} attempts {e.attempts} ${e.usd:.4f}{tail}"


def _show(e: Event, json_mode: bool, run: Callable[[], str], body: bytes | None = None) -> None:
    """`e` as `--json` prints it (its JSON `body` if given, its `run()` first), or, without
    `json_mode`, a line if it is a job's end."""
    if json_mode:
        sys.stdout.write(run_line(run(), encode(e) if body is None else body) + "\n")
        sys.stdout.flush()
    elif isinstance(e, JobEnded):
        print(_ended_line(e), flush=True)


def printer(json_mode: bool, run_of: Callable[[str], str]) -> Callable[[Event], None]:
    """A worker's output: every event of the jobs it runs, naming its run (`--json`), or a line per
    job that ended."""
    return lambda e: _show(e, json_mode, lambda: run_of(job_key(e.job, e.seed)))


class RunOutput:
    """What `actor-run run` on a shared ledger shows of its batch, whoever runs each job: the events
    of the jobs this process runs as they come (`event`, a Runner subscriber: any actor thread) and,
    each poll, those other workers recorded in the ledger (`poll`, the main thread; of a job's
    progress the ledger keeps a line at a checkpoint, a new stage or every 10 s). With `--json` each
    line is an event naming its run; otherwise a line per job that ended. `finish` (once the jobs
    ended) shows the ends not shown yet."""

    def __init__(self, runner: Runner, run: str, *, json_mode: bool) -> None:
        self.runner, self.run, self.json_mode = runner, run, json_mode
        self._lock = threading.Lock()  # one line at a time from the actor threads and the poll
        self._after = 0  # the newest ledger event id read
        self._ended: set[str] = set()  # the jobs whose end was shown

    def event(self, e: Event, body: bytes | None = None) -> None:
        key = job_key(e.job, e.seed)
        with self._lock:
            if isinstance(e, JobEnded):
                if key in self._ended:
                    return
                self._ended.add(key)
            _show(e, self.json_mode, lambda: self.run, body)

    def _recorded(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._after = max(self._after, int(row["id"]))
            body = row["body"] if isinstance(row["body"], bytes) else str(row["body"]).encode()
            try:
                e = decode_event(body)
            except msgspec.DecodeError:
                continue  # a kind a newer actor-run wrote
            self.event(e, body)

    def poll(self) -> None:
        reader = LedgerReader(self.runner.ledger_path)
        try:
            self._recorded(reader.new_events(self.run, self._after, not_by=self.runner.owner))
        finally:
            reader.close()

    def finish(self, keys: list[str]) -> None:
        """The ends of `keys` not shown yet (another worker recorded them after the last poll, or
        their ids were committed out of order), from the ledger."""
        if set(keys) <= self._ended:
            return
        reader = LedgerReader(self.runner.ledger_path)
        try:
            self._recorded(reader.events(run=self.run, kind="JobEnded"))
        finally:
            reader.close()
