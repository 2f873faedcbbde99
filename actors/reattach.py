"""An attempt taken over from a controller that died (`resume`, a worker's adoption): what the
adopter is told about the machine and its job (`Reattach`), and where the job's log goes on in the
seed's log.txt (`taken_over`). Used by AttemptActor (actors/attempt.py) on its own thread."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec

from actor_run.protocols.messages import Machine


class Reattach(msgspec.Struct, frozen=True, kw_only=True):
    """A machine whose job an earlier controller started and that still runs it (resume). With no
    `work`, the controller died after the machine answered and before it recorded a start: the
    machine is asked whether the job runs there (`Workspace.started`) before anything is started."""

    machine: Machine
    work: str
    pid: int
    launched_at: float
    handle: str = ""  # a queue job's, as recorded: followed instead of a pid


_TAKEN_OVER = re.compile(
    rb"^--- (?:run \S+ )?attempt (\d+) taken over by controller \S+ \(.*\); its log goes on from byte (\d+) ---\n",
    re.MULTILINE)


def taken_over(log: Path, attempt: int, owner: str, header: str) -> tuple[str, int]:
    """For an adopted attempt: the line that opens the adopter's writing in log.txt, and how many
    bytes of the job's log the file already holds (the heartbeat reads on from there, so no line
    is written twice). The attempt's part is the one its header opened (`--- run R attempt N on ...`);
    each takeover line records where the job's log stood, so a second adopter counts from it. With
    no part of that attempt here (another computer, a removed file): `header` and byte 0."""
    try:
        data = log.read_bytes()
    except OSError:
        return header, 0
    # the header names its run (`--- run R attempt N on ...`); a log written before runs were named has none
    opened = list(re.finditer(rb"^--- (?:run \S+ )?attempt " + str(attempt).encode() + rb" on .*---\n", data,
                              re.MULTILINE))
    if not opened:
        return header, 0
    part = data[opened[-1].end():]
    marks = [m for m in _TAKEN_OVER.finditer(part) if int(m.group(1)) == attempt]
    at = int(marks[-1].group(2)) + len(part) - marks[-1].end() if marks else len(part)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    line = f"--- attempt {attempt} taken over by controller {owner[:8]} ({when}); its log goes on from byte {at} ---\n"
    return ("" if not data or data.endswith(b"\n") else "\n") + line, at
