"""The `sky` command line (SkyPilot 0.14, client-server), run as a bounded subprocess on the reactor.

Every call is a separate `sky` process with its own time limit (`SkyHung` past it: the process is
killed, the API server may still act on what it was sent). Since SkyPilot 0.8 a launch or a down
is a *request* on SkyPilot's API server: submitted with `--async`, the CLI prints
`Submitted sky.<label> request: <uuid>` and exits 0, and the request goes on whether or not its
client does. The label is the CLI's, not the request's name, and its case varies: `sky.launch`
for a launch, `sky.Terminating` for a down (0.14's `_down_or_stop_clusters`); any is accepted.
`sky api status -a -v -o json <id>...` says where the requests we made stand: PENDING, WAITING,
RUNNING, then SUCCEEDED, FAILED or CANCELLED; `sky api status -c <cluster> -v -o json` lists the
active ones of one cluster (a request whose id we never read). Nothing lists every request.
Request names come as `sky.launch` or bare `launch` depending on the server's version; both are
accepted. Colour codes are stripped from all output, and JSON is read from the first line that
starts with `[` or `{` (the CLI may print a warning first).

Each real `sky` call takes 5-15 s on a loaded machine (a fresh Python process importing SkyPilot,
then a round trip to its API server): the default time limit of one call is 45 s.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
from typing import TypeVar

import msgspec
import trio

from actor_run.protocols.failures import ActorRunError, SpecError
from actor_run.protocols.processes import Process, run_process

T = TypeVar("T")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the label is whatever the CLI prints (`sky.launch`, `sky.Terminating`, `sky.Stopping`, ...)
_SUBMITTED = re.compile(r"Submitted sky\.(?P<verb>[A-Za-z_.]+) request: (?P<id>[0-9a-fA-F]{8}-[0-9a-fA-F-]{27})")
FINISHED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
ACTIVE = frozenset({"PENDING", "WAITING", "RUNNING"})
KILL_GRACE_S = 2.0  # after its time limit: TERM, then KILL this much later
CLI_TIMEOUT_S = 45.0  # one `sky` call: 5-15 s each on a loaded machine, three times that before SkyHung


class SkyHung(ActorRunError):
    """A `sky` command gave no answer within its time limit (it was killed)."""


class SkyFailed(ActorRunError):
    """A `sky` command exited non-zero or printed what could not be understood."""


class SkyOutput(msgspec.Struct, frozen=True, kw_only=True):
    code: int
    out: str
    err: str

    def tail(self, n: int = 400) -> str:
        text = (self.err.strip() or self.out.strip())
        return text[-n:]


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One request on SkyPilot's API server, as `sky api status -o json` lists it."""

    request_id: str
    name: str = ""
    status: str = ""
    cluster_name: str | None = None
    created_at: float = 0.0
    user_id: str = ""

    @property
    def verb(self) -> str:
        return self.name.removeprefix("sky.")


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    """One cluster record from `sky status -o json` (the fields this project reads)."""

    name: str
    status: str = ""  # INIT | UP | STOPPED
    launched_at: float | None = None
    region: str | None = None
    cluster_name_on_cloud: str | None = None
    resources_str: str | None = None


_requests = msgspec.json.Decoder(list[Request])
_clusters = msgspec.json.Decoder(list[Cluster])


def strip(text: str) -> str:
    return _ANSI.sub("", text)


def submitted(text: str) -> str | None:
    """The request id a `--async` command printed, or None."""
    m = _SUBMITTED.search(strip(text))
    return m.group("id") if m else None


def _decode(text: str, decoder: msgspec.json.Decoder[list[T]], what: str) -> list[T]:
    """The JSON list a command printed: from the first line starting with `[` that decodes (a
    warning such as `[WARNING] ...` may come before it)."""
    text = strip(text)
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("["):
            try:
                return decoder.decode("".join(lines[i:]).encode())
            except msgspec.DecodeError:
                continue
    raise SkyFailed(f"{what}: no JSON list in its output: {text.strip()[-200:]!r}")


class SkyCli:
    """`sky` as configured: the command (split like a shell would), the API server's endpoint."""

    def __init__(self, command: str, *, api_server: str = "", timeout_s: float = CLI_TIMEOUT_S) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise SpecError("clouds.skypilot.sky", "is empty")
        if shutil.which(self.argv[0]) is None:
            raise SpecError("clouds.skypilot.sky", f"{self.argv[0]} was not found: is SkyPilot installed?")
        self.api_server = api_server
        self.timeout_s = timeout_s
        self._gpus = ""  # "gpus" or "show-gpus" once known: which command prices a GPU here

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.api_server:
            env["SKYPILOT_API_SERVER_ENDPOINT"] = self.api_server
        return env

    async def run(self, *args: str, timeout: float | None = None) -> SkyOutput:
        """Run `sky <args>`; SkyHung past the time limit, SpecError if the command is not there."""
        limit = self.timeout_s if timeout is None else timeout

        async def deliver_cancel(proc: Process) -> None:
            proc.terminate()
            await trio.sleep(KILL_GRACE_S)
            proc.kill()

        with trio.move_on_after(limit) as scope:
            try:
                done = await run_process(
                    [*self.argv, *args], stdin=b"", capture_stdout=True, capture_stderr=True,
                    env=self._env(), start_new_session=True,  # a Ctrl-C of ours must not stop a teardown
                    deliver_cancel=deliver_cancel,
                )
            except FileNotFoundError as exc:
                raise SpecError("clouds.skypilot.sky", f"{self.argv[0]} was not found: is SkyPilot installed?") from exc
            return SkyOutput(code=done.returncode, out=done.stdout.decode(errors="replace"),
                             err=done.stderr.decode(errors="replace"))
        assert scope.cancelled_caught
        raise SkyHung(f"sky {' '.join(args[:2])}: no answer within {limit:.0f} s")

    async def requests(self, *ids: str) -> list[Request]:
        """The requests with these ids (or id prefixes), finished ones included (`-v`: only then is
        `cluster_name` filled in). Only what was asked about: never a listing of every request."""
        if not ids:
            return []
        res = await self.run("api", "status", "-a", "-v", "-o", "json", *ids)
        if res.code != 0:
            raise SkyFailed(f"sky api status exited {res.code}: {res.tail()}")
        return _decode(res.out, _requests, "sky api status")

    async def active(self, cluster: str) -> list[Request]:
        """The requests of `cluster` still pending or running: for one whose id was never read (a
        `sky launch` that hung after submitting). The server filters (`-c`, 0.14); no `-a`, so
        finished requests are not listed at all."""
        res = await self.run("api", "status", "-c", cluster, "-v", "-o", "json")
        if res.code != 0:
            raise SkyFailed(f"sky api status -c exited {res.code}: {res.tail()}")
        return [r for r in _decode(res.out, _requests, "sky api status")
                if r.cluster_name == cluster and r.status in ACTIVE]

    async def request(self, request_id: str) -> Request | None:
        for r in await self.requests(request_id):
            if r.request_id.startswith(request_id) or request_id.startswith(r.request_id):
                return r
        return None

    async def cancel(self, *ids: str) -> None:
        res = await self.run("api", "cancel", "-y", *ids)
        if res.code != 0:
            raise SkyFailed(f"sky api cancel exited {res.code}: {res.tail()}")

    async def logs(self, request_id: str) -> str:
        """What the request printed; for a failed one, the remote exception (exit 1 then)."""
        res = await self.run("api", "logs", request_id)
        return strip(res.out + "\n" + res.err)

    async def clusters(self, *names: str, all_users: bool = False) -> list[Cluster]:
        args = ["status", "-o", "json", *(["-u"] if all_users else []), *names]
        res = await self.run(*args)
        if res.code != 0:
            raise SkyFailed(f"sky status exited {res.code}: {res.tail()}")
        return _decode(res.out, _clusters, "sky status")

    async def head_ip(self, name: str) -> str:
        res = await self.run("status", "--ip", name)
        words = strip(res.out).split()
        if res.code != 0 or not words:
            raise SkyFailed(f"sky status --ip {name} exited {res.code}: {res.tail()}")
        return words[-1]

    async def hourly_price(self, accelerator: str, infra: str, *, spot: bool, count: int = 1) -> float | None:
        """The lowest hourly price SkyPilot's catalog gives for `count` of `accelerator` on one machine (exactly that
        name: its filter is a case-insensitive pattern, so `T4` also lists `T4g`, `A100` also
        `A100-80GB`) in `infra`, or None when it gives none. `sky gpus list -o json` where the CLI
        has it, else the table of the deprecated `sky show-gpus` (one table per matching name)."""
        query = [f"{accelerator}:{count}", "--infra", infra]
        if self._gpus != "show-gpus":
            res = await self.run("gpus", "list", *query, "-o", "json")
            if res.code == 0:
                self._gpus = "gpus"
                return lowest_json(strip(res.out), accelerator, infra, spot=spot, count=count)
            if res.code != 2 or "No such command" not in res.err:  # exit 2: a usage error (click's)
                raise SkyFailed(f"sky gpus list exited {res.code}: {res.tail()}")
            self._gpus = "show-gpus"  # before `sky gpus` existed
        res = await self.run("show-gpus", *query)
        if res.code != 0:
            raise SkyFailed(f"sky show-gpus exited {res.code}: {res.tail()}")
        return lowest_table(strip(res.out), accelerator, spot=spot, count=count)


def _region(infra: str) -> str:
    parts = infra.split("/")
    return parts[1] if len(parts) > 1 else ""


def lowest_json(text: str, accelerator: str, infra: str, *, spot: bool, count: int = 1) -> float | None:
    """From `sky gpus list -o json` ({name: [InstanceTypeInfo as a dict, ...]}): the lowest price of
    a machine with `count` of `accelerator` in the region of `infra`; None when none has a price."""
    start = next((i for i, line in enumerate(text.splitlines()) if line.startswith("{")), None)
    if start is None:
        raise SkyFailed(f"sky gpus list: no JSON object in its output: {text.strip()[-200:]!r}")
    try:  # json, not msgspec: a price the catalog lacks is printed as NaN
        found = json.loads("\n".join(text.splitlines()[start:]))
    except json.JSONDecodeError as exc:
        raise SkyFailed(f"sky gpus list: unreadable JSON: {exc}") from exc
    if not isinstance(found, dict):
        raise SkyFailed("sky gpus list: not a JSON object")
    key = "spot_price" if spot else "price"
    region = _region(infra)
    prices = []
    for item in found.get(accelerator) or []:  # exactly that name: `T4` is not `T4g`
        if not isinstance(item, dict) or item.get("accelerator_count") not in (count, float(count)):
            continue
        if region and item.get("region") not in (region, None):
            continue
        price = item.get(key)
        if isinstance(price, int | float) and math.isfinite(price) and price > 0:
            prices.append(float(price))
    return min(prices) if prices else None


def lowest_table(text: str, accelerator: str, *, spot: bool, count: int = 1) -> float | None:
    """From `sky show-gpus` (or `sky gpus list`) tables: the lowest HOURLY_PRICE (or
    HOURLY_SPOT_PRICE) of the rows for exactly `accelerator` on one device; None if absent (a
    missing price is printed as `-`)."""
    column = "HOURLY_SPOT_PRICE" if spot else "HOURLY_PRICE"
    header: list[str] | None = None
    prices: list[float] = []
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if column in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header):
            header = None if not line.strip() else header
            continue
        qty = cells[header.index("QTY")]
        if cells[header.index("GPU")] != accelerator or not re.fullmatch(rf"{count}(?:\.0)?", qty):
            continue  # another name the pattern matched, or another count of devices (0.14 prints `1.0`)
        m = re.fullmatch(r"\$ ?(\d+(?:\.\d+)?)", cells[header.index(column)])
        if m and float(m.group(1)) > 0:
            prices.append(float(m.group(1)))
    return min(prices) if prices else None


__all__ = ["ACTIVE", "CLI_TIMEOUT_S", "FINISHED", "Cluster", "Request", "SkyCli", "SkyFailed", "SkyHung", "SkyOutput",
           "lowest_json", "lowest_table", "strip", "submitted"]
