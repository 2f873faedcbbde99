"""The machines a fake provider hands out: each a real OpenSSH sshd on 127.0.0.1 of its own (its
own port and host key), whose logins get HOME=<its folder>/home, the environment the vendor puts
on a machine, and only the public key the create call carried in authorized_keys.

    boxes = Boxes(tmp_path / "machines")
    box = boxes.start("pod-1", public_key, env={"RUNPOD_POD_ID": "pod-1"})
    box.port, box.user, box.home
    boxes.vanish("pod-1")      # the machine is gone: its sshd, its processes and its folder
    boxes.stop_all()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path

import psutil
from sshd import Sshd


class Box(Sshd):
    """One machine: an sshd whose sessions live in `home` with the vendor's environment."""

    def __init__(self, dir: Path, public_key: str, env: dict[str, str], *, address: str = "127.0.0.1",
                 port: int | None = None) -> None:
        self.env = dict(env)
        self._address = address
        self.home = Path(dir) / "home"
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.env["HOME"] = str(self.home)
        self._public_key = public_key
        super().__init__(dir, port=port)
        self.authorized_keys.write_text(public_key.strip() + "\n")

    def _write_config(self) -> None:
        self.address = self._address
        super()._write_config()
        pairs = " ".join(f'"{k}={v}"' for k, v in self.env.items())
        with self.config.open("a") as f:
            f.write(f"SetEnv {pairs}\n")


def _runs_in(proc: psutil.Process, marker: str) -> bool:
    if any(marker in part for part in proc.info["cmdline"] or []):
        return True
    try:  # a job started there: its folder is its cwd, or its environment names it (HOME)
        return (proc.cwd() or "").startswith(marker) or proc.environ().get("HOME", "").startswith(marker)
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _kill_under(path: Path, also: list[psutil.Process] | None = None) -> None:
    """Every process the machine runs (its command line, cwd or HOME is under `path`) and `also`,
    killed at one moment: the machine is gone all at once, as a failed host is."""
    marker = str(path)
    doomed = list(also or [])
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and _runs_in(proc, marker):
                doomed.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in doomed:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signal.SIGKILL)


class Boxes:
    """The machines of one fake provider, by its id for them."""

    def __init__(self, dir: Path) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.boxes: dict[str, Box] = {}
        self._lock = threading.Lock()

    def start(self, machine_id: str, public_key: str, env: dict[str, str] | None = None, *,
              address: str = "127.0.0.1", port: int | None = None) -> Box:
        """A machine; `address` and `port` for a vendor whose machines each have an IP of their own
        and answer on one port (many loopback addresses, one port); by default a port of its own."""
        box = Box(self.dir / machine_id, public_key, env or {}, address=address, port=port)
        with self._lock:
            self.boxes[machine_id] = box
        return box

    def vanish(self, machine_id: str) -> None:
        with self._lock:
            box = self.boxes.pop(machine_id, None)
        if box is None:
            return
        sshd: list[psutil.Process] = []
        if box.proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                sshd = [psutil.Process(box.proc.pid), *psutil.Process(box.proc.pid).children(recursive=True)]
        _kill_under(box.dir, also=sshd)  # its sessions and its jobs at one moment
        box.stop()
        _kill_under(box.dir)
        shutil.rmtree(box.dir, ignore_errors=True)

    def stop_all(self) -> None:
        for machine_id in list(self.boxes):
            self.vanish(machine_id)
