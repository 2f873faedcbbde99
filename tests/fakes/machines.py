"""The machines a fake provider hands out: each a real OpenSSH sshd on 127.0.0.1 of its own (its
own port and host key), whose logins get HOME=<its folder>/home, the environment the vendor puts
on a machine, and only the public key the create call carried in authorized_keys.

    boxes = Boxes(tmp_path / "machines")
    box = boxes.start("pod-1", public_key, env={"RUNPOD_POD_ID": "pod-1"})
    box.port, box.user, box.home
    boxes.vanish("pod-1")      # the machine is gone: its sshd, its processes and its folder
    boxes.stop_all()

A machine as a real provider hands it out comes up in steps (the API says ready before the guest
is; Hyperstack's own integrators note it, and every vendor's document tells to retry SSH):

    port = boxes.plan("vm-1", public_key, address="127.0.0.5", port=2222)   # nothing listens: refused
    boxes.firewall("vm-1", closed=True)   # the port is filtered: TCP accepted, not a byte said
    boxes.boot("vm-1", after_s=5.0, before="refuse")   # the API said ready; sshd opens 5 s later
    boxes.firewall("vm-1", closed=False)  # the ingress rule landed
    boxes.open_now()                      # every guest's sshd opens now, its timer or not

A machine has the GPUs its provider sold: `tools` (made by `gpu_tools`) puts an `nvidia-smi` that
lists them, and a `date` whose clock may be off, first on its logins' PATH:

    boxes.plan("vm-1", public_key, tools=gpu_tools("NVIDIA A100-SXM4-80GB", 8))
    gpu_tools("NVIDIA A100-SXM4-80GB", 8, fault="wrong")   # lists 8 of another class
    gpu_tools("NVIDIA A100-SXM4-80GB", 8, fault="few")     # lists 7
    gpu_tools("NVIDIA A100-SXM4-80GB", 8, fault="none")    # no driver: nvidia-smi fails
    gpu_tools("NVIDIA A100-SXM4-80GB", 1, skew_s=300)      # `date +%s` 5 minutes ahead

`before` is what the port does between ready and sshd: "refuse" (nothing listens), "drop" (TCP
accepted and closed at once: sshd restarting after its host keys were made), "silent" (TCP
accepted, no banner).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import procs
from support.sshd import Sshd, free_port

WRONG_GPU = {"NVIDIA GeForce RTX 4090": "NVIDIA RTX A6000"}  # another class than the one sold


def gpu_tools(smi_name: str, count: int, *, fault: str = "", skew_s: float = 0.0) -> dict[str, str]:
    """The `nvidia-smi` and `date` of a machine with `count` GPUs that the driver names `smi_name`
    (`nvidia-smi --query-gpu=name --format=csv,noheader` prints one name a line); `fault`: "wrong" (as
    many of another class), "few" (one less), "none" (no driver: nvidia-smi fails as it does then);
    `skew_s`: the machine's clock is that far off (`date +%s`; any other `date` is the real one)."""
    if fault == "wrong":
        smi_name = WRONG_GPU.get(smi_name, "NVIDIA GeForce RTX 4090")
    n = count - 1 if fault == "few" else count
    lines = "\n".join([smi_name] * n)
    smi = ("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the NVIDIA driver. Make "
           "sure that the latest NVIDIA driver is installed and running.'\nexit 9\n" if fault == "none"
           else f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\n")
    real = shutil.which("date", path="/usr/bin:/bin") or "/bin/date"
    date = (f'#!/bin/sh\nif [ "$#" = 1 ] && [ "$1" = "+%s" ]; then echo $(( $({real} +%s) + {int(skew_s)} )); '
            f'else exec {real} "$@"; fi\n')
    return {"nvidia-smi": smi, "date": date}


class Box(Sshd):
    """One machine: an sshd whose sessions live in `home` with the vendor's environment (and, with
    `tools`, those commands first on their PATH)."""

    def __init__(self, dir: Path, public_key: str, env: dict[str, str], *, address: str = "127.0.0.1",
                 port: int | None = None, tools: dict[str, str] | None = None) -> None:
        self.env = dict(env)
        self._address = address
        self.home = Path(dir) / "home"
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.env["HOME"] = str(self.home)
        if tools:
            bin_dir = Path(dir) / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            for name, text in tools.items():
                (bin_dir / name).write_text(text)
                (bin_dir / name).chmod(0o755)
            self.env["PATH"] = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self._public_key = public_key
        super().__init__(dir, port=port)
        self.authorized_keys.write_text(public_key.strip() + "\n")

    def _write_config(self) -> None:
        self.address = self._address
        super()._write_config()
        pairs = " ".join(f'"{k}={v}"' for k, v in self.env.items())
        with self.config.open("a") as f:
            f.write(f"SetEnv {pairs}\n")


def _kill_under(path: Path, also: list[int] | None = None) -> None:
    """Every process the machine runs (its command line, cwd or HOME is under `path`) and the pids
    `also`, killed at one moment: the machine is gone all at once, as a failed host is."""
    doomed = [*(also or []), *(pid for pid, _ in procs.under(path, cwd_home=True))]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class Porch:
    """What answers at a machine's address and port before its sshd: a listener that accepts TCP
    and either holds the connection without a byte ("silent": a filtered port, a guest without its
    banner yet) or closes it at once ("drop"). Its thread ends on `close()`."""

    def __init__(self, address: str, port: int, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(64)
        self.sock.settimeout(0.05)
        self.held: list[socket.socket] = []
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"porch-{address}:{port}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():  # bounded by close()
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.mode == "silent":
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        for conn in self.held:
            conn.close()


@dataclass
class _Guest:
    """A machine the API knows that has no sshd yet (see the module docstring)."""

    public_key: str
    env: dict[str, str]
    address: str
    port: int
    before: str = "refuse"
    tools: dict[str, str] | None = None
    due: bool = False  # its sshd's time has come
    filtered: bool = False  # the provider's firewall drops the port (Hyperstack until its rule)
    porch: Porch | None = None
    timer: threading.Timer | None = None
    starting: bool = False


class Boxes:
    """The machines of one fake provider, by its id for them."""

    def __init__(self, dir: Path) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.boxes: dict[str, Box] = {}
        self.guests: dict[str, _Guest] = {}
        self.knocks: dict[str, int] = {}  # connections a machine's porch took before its sshd opened
        self.foreign_key = ""  # set: machines authorize this public key, not the one their create carried
        self._lock = threading.Lock()

    @property
    def user(self) -> str:
        return getpass.getuser()

    def plan(self, machine_id: str, public_key: str, env: dict[str, str] | None = None, *,
             address: str = "127.0.0.1", port: int | None = None, tools: dict[str, str] | None = None) -> int:
        """A machine the API has made whose guest is not up: nothing listens at its address (a
        connection is refused) until `boot`. Its port (a free one of its own by default)."""
        guest = _Guest(self.foreign_key or public_key, dict(env or {}), address, port or free_port(), tools=tools)
        with self._lock:
            self.guests[machine_id] = guest
        return guest.port

    def boot(self, machine_id: str, after_s: float = 0.0, *, before: str = "refuse") -> None:
        """The API said ready: sshd opens `after_s` later (at once for 0); meanwhile the port does
        `before`."""
        with self._lock:
            guest = self.guests.get(machine_id)
            if guest is None or guest.timer is not None or guest.due:
                return
            guest.before = before
            if after_s > 0:
                guest.timer = threading.Timer(after_s, self._due, args=(machine_id,))
                guest.timer.daemon = True
                guest.timer.start()
        if after_s > 0:
            self._settle(machine_id)
        else:
            self._due(machine_id)

    def open_now(self) -> None:
        """Every guest booted so far opens its sshd now, its timer or not (a test that needs a
        machine to wait for SSH as long as the test looks at it, and no longer)."""
        with self._lock:
            waiting = {m: g.timer for m, g in self.guests.items() if g.timer is not None and not g.due}
        for machine_id, timer in waiting.items():
            timer.cancel()
            self._due(machine_id)

    def firewall(self, machine_id: str, *, closed: bool) -> None:
        with self._lock:
            guest = self.guests.get(machine_id)
            if guest is None:
                return
            guest.filtered = closed
        self._settle(machine_id)

    def _due(self, machine_id: str) -> None:
        with self._lock:
            guest = self.guests.get(machine_id)
            if guest is None:
                return
            guest.due = True
        self._settle(machine_id)

    def _settle(self, machine_id: str) -> None:
        """Make what listens at the guest's address what its state says."""
        with self._lock:
            guest = self.guests.get(machine_id)
            if guest is None or guest.starting:
                return
            want = ("silent" if guest.filtered else "sshd" if guest.due
                    else "" if guest.before == "refuse" else guest.before)
            porch = guest.porch
            if porch is not None and porch.mode == want:
                return
            guest.porch = None
            if want == "sshd":
                guest.starting = True
        if porch is not None:
            self.knocks[machine_id] = self.knocks.get(machine_id, 0) + porch.accepted
            porch.close()
        if want == "sshd":
            box = Box(self.dir / machine_id, guest.public_key, guest.env, address=guest.address, port=guest.port,
                      tools=guest.tools)
            with self._lock:
                if self.guests.pop(machine_id, None) is not None:
                    self.boxes[machine_id] = box
                    return
            _stop_box(box)  # vanished while its sshd was starting
        elif want:
            made = Porch(guest.address, guest.port, want)
            with self._lock:
                if self.guests.get(machine_id) is guest and guest.porch is None:
                    guest.porch = made
                    return
            made.close()

    def _forget_guest(self, machine_id: str) -> None:
        with self._lock:
            guest = self.guests.pop(machine_id, None)
        if guest is None:
            return
        if guest.timer is not None:
            guest.timer.cancel()
            if guest.timer is not threading.current_thread():
                guest.timer.join(5)
        if guest.porch is not None:
            guest.porch.close()

    def start(self, machine_id: str, public_key: str, env: dict[str, str] | None = None, *,
              address: str = "127.0.0.1", port: int | None = None, tools: dict[str, str] | None = None) -> Box:
        """A machine; `address` and `port` for a vendor whose machines each have an IP of their own
        and answer on one port (many loopback addresses, one port); by default a port of its own."""
        box = Box(self.dir / machine_id, public_key, env or {}, address=address, port=port, tools=tools)
        with self._lock:
            self.boxes[machine_id] = box
        return box

    def vanish(self, machine_id: str) -> None:
        self._forget_guest(machine_id)
        with self._lock:
            box = self.boxes.pop(machine_id, None)
        if box is None:
            return
        _stop_box(box)

    def stop_all(self) -> None:
        for machine_id in [*self.guests, *self.boxes]:
            self.vanish(machine_id)


def _stop_box(box: Any) -> None:
    # its sshd by pid while it runs (poll: a reaped sshd's pid may be another process's by now)
    sshd = [box.proc.pid, *procs.descendants(box.proc.pid)] if box.proc is not None and box.proc.poll() is None else []
    _kill_under(box.dir, also=sshd)  # its sessions and its jobs at one moment
    box.stop()
    _kill_under(box.dir)
    shutil.rmtree(box.dir, ignore_errors=True)
