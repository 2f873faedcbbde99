"""What every fake provider of rented machines holds beside its vendor's API (fakes/runpod.py,
hyperstack.py, lambdacloud.py, shadeform.py, vastai.py subclass `RentedFake`): its machines, the
faults a test sets on it, and what a test reads back. The tests parametrized over `FAKES`
(fakes/providers.py) use these names on every fake alike; docs/adding-a-cloud.md lists them.

Faults, each fake's module docstring saying how its vendor shows them: `create_500_made` (the
next n creates make the machine, then answer 5xx), `create_500` (5xx, nothing made), `stuck` (a
machine never ready), `lag_reads` (a new machine missing from that many reads), `delete_fail`,
`ready_after` (reads before a machine is ready), `ssh_after_s` / `guest_before` (the guest's sshd
opens that long after the API says ready; `before`: fakes/machines.py), `launch_answers` (what
the next creates answer: "no_stock", "fail"), `smi_next` / `skew_next` (the next machines'
nvidia-smi fault and clock skew: fakes/machines.py `gpu_tools`). Read back: `created` (every
create's body, as sent), `billed` ((name, seconds, $/h) of every machine ended).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from actor_run.protocols.clouds.gpus import vendor_ids
from fakes.machines import Boxes, gpu_tools
from fakes.openapi_server import OpenAPIFake

# The guests' loopback addresses: 127.<this test process's own>.x.y, one per machine of every fake in the
# process. Each guest's port is a free one, chosen at its plan and not held while its sshd is not up yet
# (the port refuses, as a booting guest's does): a guest of another worker's fake could take the same
# port meanwhile, and when every fake counted from 127.0.0.2 a client then met that other sshd, which
# refused its key (seen once in a full run). Apart by address, a taken port number no longer matters.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_OCTET = 1 + (int(_worker[2:]) if _worker[2:].isdigit() else os.getpid()) % 250
_GUESTS = itertools.count()


class RentedFake(OpenAPIFake):
    """A vendor's API on loopback whose machines are real sshd logins under `machines` (or none at
    all: `virtual`, for tests and benches that only ask the API). Handlers run on the server's
    threads under `self.lock`; tests set the faults before or between calls."""

    CLOUD: str  # the cloud's name in actor-run (and in protocols/clouds/gpus.py's vendor tables)
    KEY_VAR: str  # the environment variable its API key is read from
    GPUS: tuple[str, str]  # two GPU classes it sells (tests make the first out of stock)
    stock: dict[Any, int]  # machines left per place, keyed as each vendor keys them (a GPU id in the key)

    def __init__(self, document: Path, machines: Path, *, token: str, virtual: bool, base_path: str = "",
                 relax: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(document, base_path=base_path, token=token, relax=relax)
        self.boxes = Boxes(machines)
        self.virtual = virtual  # machines without sshd: their addresses point nowhere
        self.create_500_made = 0
        self.create_500 = 0
        self.stuck = False
        self.lag_reads = 0
        self.delete_fail = 0
        self.ready_after = 1
        self.ssh_after_s = 0.3  # every vendor's document: sshd comes up after the API says ready
        self.guest_before = "refuse"
        self.launch_answers: list[str] = []
        self.smi_next: list[str] = []
        self.skew_next: list[float] = []
        self.created: list[dict[str, Any]] = []
        self.billed: list[tuple[str, float, float]] = []

    def _address(self) -> str:
        """A loopback address of the next machine's own (127.<this process's>.x.y: see _GUESTS)."""
        n = next(_GUESTS)
        return f"127.{_OCTET}.{n // 250 % 250}.{n % 250 + 2}"

    def _tools(self, smi_name: str, count: int) -> dict[str, str]:
        """The next machine's `nvidia-smi` and `date`, with the next `smi_next` / `skew_next` fault."""
        return gpu_tools(smi_name, count, fault=self.smi_next.pop(0) if self.smi_next else "",
                         skew_s=self.skew_next.pop(0) if self.skew_next else 0.0)

    def _view(self, machine: dict[str, Any]) -> dict[str, Any]:
        """A machine as the API shows it: its keys that start with `_` are the fake's own."""
        return {k: v for k, v in machine.items() if not k.startswith("_")}

    def _hidden(self, machine: dict[str, Any]) -> bool:
        """Whether this read leaves a new machine out (`lag_reads`: its `_lag` counts down per read)."""
        if machine["_lag"] > 0:
            machine["_lag"] -= 1
            return True
        return False

    @contextlib.contextmanager
    def _without_sshd(self) -> Iterator[None]:
        """Machines made meanwhile have no sshd (one already on the account: nobody logs in). Under
        `self.lock`."""
        virtual, self.virtual = self.virtual, True
        try:
            yield
        finally:
            self.virtual = virtual

    def _stock_gpu(self, key: Any) -> str:
        """The vendor's GPU id a `stock` key stands for (its first part unless a fake says otherwise)."""
        return key[0]

    def no_stock(self, gpu: str) -> None:
        """None of our GPU class `gpu` anywhere: every place selling it has none left."""
        with self.lock:
            for key in self.stock:
                if self._stock_gpu(key) in vendor_ids(gpu, self.CLOUD):
                    self.stock[key] = 0
