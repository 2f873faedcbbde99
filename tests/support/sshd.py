"""A real OpenSSH `sshd` on loopback for tests and benches: its own config, host key and user key.

    sshd = Sshd(tmp_dir)            # started; logs in as the current user with `sshd.user_key`
    ...
    sshd.restart()                  # same port, same host key (every connection is cut)
    sshd.restart_with_new_host_key()
    sshd.kill_sessions()            # cut every connection, the listener stays
    sshd.stop()                     # always: kills it and waits

Importable from any test or bench (no pytest here); the fixture lives beside the tests that use it.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import psutil

from .waits import settled

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _keygen(path: Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )


def _end(procs: list[psutil.Process]) -> None:
    """TERM (a remote shell then removes its temporary folder), KILL what is left after 2 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        if _wait_dead(procs, timeout=2.0 if sig == signal.SIGTERM else 10.0):
            return


def _wait_dead(procs: list[psutil.Process], timeout: float = 10.0) -> bool:
    """Until each is gone or a zombie (what is re-parented to pid 1 may be reaped late)."""
    def dead(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return not settled(lambda: [p for p in procs if not dead(p)], timeout, every=0.01)


class Sshd:
    """One sshd process on 127.0.0.1:<port>, everything it needs under `dir`."""

    def __init__(self, dir: Path, port: int | None = None) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.address = "127.0.0.1"
        self.port = port or free_port()
        self.user = getpass.getuser()
        self.host_key = self.dir / "host_ed25519"
        self.user_key = self.dir / "user_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"  # for `ssh_args()`: holds the current host key
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        _keygen(self.host_key, "actor-run-test-host")
        _keygen(self.user_key, "actor-run-test-user")
        shutil.copyfile(self.user_key.with_name(self.user_key.name + ".pub"), self.authorized_keys)
        self.authorized_keys.chmod(0o600)
        self._write_config()
        self.start()

    def _write_config(self) -> None:
        root_login = "PermitRootLogin yes\n" if os.geteuid() == 0 else ""
        self.config.write_text(
            f"ListenAddress {self.address}\n"
            f"Port {self.port}\n"
            f"HostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PidFile {self.dir / 'sshd.pid'}\n"
            f"{root_login}"
            "StrictModes no\n"
            "UsePAM no\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "AllowAgentForwarding no\n"
            "AllowTcpForwarding no\n"
            "X11Forwarding no\n"
            "PrintMotd no\n"
            "MaxSessions 64\n"
            "MaxStartups 64\n"
            "LogLevel ERROR\n"
            "Subsystem sftp internal-sftp\n"
        )
        host_pub = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n")

    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("sshd is already running")
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege separation
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        proc = self.proc

        def listening() -> bool:  # an external process: exited, or listening yet
            if proc.poll() is not None:
                return True
            try:
                with socket.create_connection((self.address, self.port), timeout=1):
                    return True
            except OSError:
                return False

        if not settled(lambda: not listening(), START_TIMEOUT_S, every=0.02):
            if proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"sshd exited at start: {self.log.read_text()[-2000:]}")
            return
        self.stop()
        raise RuntimeError(f"sshd did not listen on {self.port}: {self.log.read_text()[-2000:]}")

    def kill_sessions(self) -> int:
        """End every per-connection sshd child (and what they run): all connections drop."""
        if self.proc is None:
            return 0
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        _end(children)
        return len(children)

    def stop(self) -> None:
        """End the listener, every session it started and what they ran; wait for all of them."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        _end(family)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def restart_with_new_host_key(self) -> None:
        self.stop()
        _keygen(self.host_key, "actor-run-test-host")
        self._write_config()
        self.start()

    def ssh_args(self) -> list[str]:
        """`ssh` options and destination: append a command (`[*sshd.ssh_args(), "true"]`)."""
        return ["ssh", *self.ssh_options(), f"{self.user}@{self.address}"]

    def ssh_options(self) -> list[str]:
        return [
            "-p", str(self.port), "-i", str(self.user_key),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes", "-F", "/dev/null",
        ]

    def cloud_toml(self, tmp: Path, *, slots: int | None = None) -> str:
        """A batch's candidate on the ssh cloud whose one host, `box`, is this sshd (the batch's
        tail: the candidate and the cloud's tables); host keys pinned in `tmp`, jobs under `tmp`/root."""
        return f"""
[[candidates]]
cloud = "ssh"
hosts = ["box"]

[clouds.ssh]
known_hosts = "{tmp / 'known_hosts'}"

[clouds.ssh.hosts.box]
address = "{self.address}"
port = {self.port}
user = "{self.user}"
key = "{self.user_key}"
root = "{tmp / 'root'}"
""" + (f"slots = {slots}\n" if slots is not None else "")

    def __enter__(self) -> Sshd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
